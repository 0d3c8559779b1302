//! A foreign architecture's run (`Expect::Smoke`): the agent and the test tool built for
//! it, the script that runs them in the guest (the tool's `smoke`), and the judgement of
//! the one JSON line the smoke test prints there (bytes exact, redirected bytes grown).

use std::path::Path;

use anyhow::{Result, bail};
use serde_json::Value;
use xtask_lib::workspace;

use crate::{Build, arch::Cross, guest};

/// Bytes each way: a few MiB, a few seconds under emulation.
pub const BYTES: u64 = 4 << 20;

/// The test tool, whose `smoke` the guest runs: its package and binary.
const TOOL: (&str, &str) = (workspace::TESTBED, workspace::TEST_TOOL);
/// The smoke test's name where the run is recorded (`tests`, `failed_tests`).
pub const NAME: &str = "bypass-test-tool smoke";

/// Builds the agent and the test tool for `cross` (in the profile the host's agent at
/// `host_agent` was built in) and returns the run script and `(name, binary)` of what
/// it runs.
pub fn prepare(
    build: &dyn Build,
    host_agent: &Path,
    cross: &Cross,
    modules: &Path,
) -> Result<(String, Vec<(String, String)>)> {
    let debug = host_agent
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|p| p == "debug");
    let bins = build.cross(cross, debug, &[(workspace::AGENT, workspace::AGENT), TOOL])?;
    let [agent, tool] = bins.as_slice() else {
        bail!("expected two binaries from the cross build, got {bins:?}");
    };
    let (agent, tool) = (agent.display().to_string(), tool.display().to_string());
    let script = guest::smoke_script(&guest::Smoke {
        modules: &modules.display().to_string(),
        agent: &agent,
        tool: &tool,
        loader: (cross.loader, &cross.loader_file()),
        libdir: cross.libdir,
        bytes: BYTES,
    });
    Ok((script, vec![(NAME.to_owned(), tool)]))
}

/// Whether the smoke run passed: a result line, the agent loaded, every byte exact both
/// ways, redirected bytes grown, the script's exit 0.
pub fn judge(smoke: Option<&Value>, exit: Option<i32>) -> Result<()> {
    let Some(s) = smoke else {
        bail!("{NAME} printed no result (run script exit {exit:?}; see the console above)");
    };
    if let Some(e) = s["error"].as_str() {
        bail!("{NAME} failed: {e}");
    }
    if s["status"].is_null() {
        bail!("the agent did not load (no status)");
    }
    if s["exact"] != true {
        bail!(
            "the bytes differ: client {}, server {}",
            s["client"],
            s["server"]
        );
    }
    let grew = s["redirected_bytes_grew"].as_u64().unwrap_or(0);
    if grew == 0 {
        bail!(
            "redirected bytes did not grow ({} before, {} after)",
            s["redirected_bytes_before"],
            s["redirected_bytes_after"]
        );
    }
    if s["pass"] != true || exit != Some(0) {
        bail!(
            "{NAME} did not pass (exit {exit:?}; agent exit {}, warnings {})",
            s["agent_exit"],
            s["agent_warnings"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result(exact: bool, grew: u64) -> Value {
        json!({"pass": exact && grew > 0, "exact": exact, "redirected_bytes_before": 0,
            "redirected_bytes_after": grew, "redirected_bytes_grew": grew,
            "status": {"attached": true}, "client": {}, "server": {}, "agent_exit": 0,
            "agent_warnings": []})
    }

    #[test]
    fn passes_only_exact_and_redirected() {
        assert!(judge(Some(&result(true, 8 << 20)), Some(0)).is_ok());
        let differ = judge(Some(&result(false, 8 << 20)), Some(1)).unwrap_err();
        assert!(differ.to_string().contains("bytes differ"), "{differ}");
        let flat = judge(Some(&result(true, 0)), Some(1)).unwrap_err();
        assert!(flat.to_string().contains("did not grow"), "{flat}");
        assert!(judge(None, Some(0)).is_err());
        assert!(judge(Some(&json!({"pass": false, "error": "boom"})), Some(1)).is_err());
        assert!(judge(Some(&result(true, 1)), Some(1)).is_err());
    }
}
