//! `cargo xtask kernel-table`: the README's kernel × guarantee table, from the results
//! of `cargo xtask test --kernel NAME` runs (`results/kernels/*.json`), written between
//! the README's `kernel-table` markers.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use xtask_lib::workspace;

use super::{KERNELS, results_dir};

const START: &str = "<!-- kernel-table:start (cargo xtask kernel-table) -->";
const END: &str = "<!-- kernel-table:end -->";

/// Columns proven by tests: the heading and the test names (prefixes of the name
/// after its module path) that must have run and passed.
const TESTED: [(&str, &[&str]); 7] = [
    (
        "redirect IPv4 / IPv6",
        &["ipv4_64mib", "ipv6_64mib", "dual_stack"],
    ),
    (
        "loopback / mesh pairing",
        &[
            "sidecar_chain",
            "loopback_tuples",
            "clusterip_dnat",
            "loopback_bypassed",
        ],
    ),
    (
        "isolation",
        &["attacker_namespace", "host_loopback", "only_pod_to_pod"],
    ),
    (
        "order; directions come back",
        &["blocked_waitall", "sigterm", "slow_reader"],
    ),
    (
        "read guard: splice (Go io.Copy, HAProxy)",
        &["splice_read_guarded", "go_io_copy", "haproxy_splice"],
    ),
    ("MSG_ZEROCOPY completions", &["msg_zerocopy"]),
    ("TCP_ULP refused", &["ulp_refused"]),
];

/// The test names a run recorded under `key` (`passed_tests`, `failed_tests`).
fn names<'a>(run: &'a Value, key: &str) -> Vec<&'a str> {
    run[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// One cell for a tested column: "yes" only when a test of the column passed and none
/// failed; "—" when none of them ran.
fn tested(run: &Value, prefixes: &[&str]) -> String {
    // A prefix may begin at any segment of the name, `::` read as `_`, so it finds a test
    // under every name runs recorded: bare (before the one privileged binary), then
    // `topic::name`, now `topic::file::name` (`go_io_copy`: `apps::go_io_copy_echo_exact`,
    // `apps::go::io_copy_echo_exact`).
    let ours = |t: &&str| {
        let segments: Vec<&str> = t.split("::").collect();
        (0..segments.len()).any(|i| {
            let name = segments[i..].join("_");
            prefixes.iter().any(|p| name.starts_with(p))
        })
    };
    let bad: Vec<&str> = names(run, "failed_tests")
        .into_iter()
        .filter(ours)
        .collect();
    let good = names(run, "passed_tests").into_iter().filter(ours).count();
    if bad.is_empty() && good == 0 {
        "—".into()
    } else if bad.is_empty() {
        "yes".into()
    } else {
        format!("**no** ({})", bad.join(", "))
    }
}

/// The cells after "queue bound" of a smoke run (a foreign architecture): one IPv4
/// transfer, which says nothing of the other columns.
fn smoke_cells(run: &Value) -> String {
    let s = &run["smoke"];
    let redirect = if s["pass"] == true {
        format!(
            "IPv4 (smoke: {} MiB each way, exact)",
            s["bytes"].as_u64().unwrap_or(0) >> 20
        )
    } else {
        "**no**".to_owned()
    };
    let verdict = if s["pass"] == true {
        "passed"
    } else {
        "failed"
    };
    format!(
        " {redirect} |{} smoke test {verdict} |\n",
        " — |".repeat(TESTED.len() - 1)
    )
}

/// The table's markdown from the runs.
pub fn render(runs: &[Value]) -> String {
    let mut out = String::from("| kernel | who runs it | loads | queue bound |");
    for (h, _) in TESTED {
        out += &format!(" {h} |");
    }
    out += " tests |\n|";
    out += &" --- |".repeat(5 + TESTED.len());
    out += "\n";
    for run in runs {
        let name = run["kernel"].as_str().unwrap_or("?");
        let release = run["release"].as_str().unwrap_or("did not boot");
        out += &format!(
            "| {name} (`{release}`) | {} |",
            run["note"].as_str().unwrap_or("")
        );
        if run["expect"] == "Refuses" {
            let line = run["refusal"]["line"].as_str().unwrap_or("");
            out += &format!(" refuses: `{line}` | — |");
            out += &" — |".repeat(TESTED.len() + 1);
            out += "\n";
            continue;
        }
        let features = &run["status"]["features"];
        let loads = if run["status"].is_null() {
            "**no**"
        } else {
            "yes"
        };
        let bound = match features["queue_bound"].as_bool() {
            Some(true) => "yes".to_owned(),
            Some(false) => format!(
                "off: {}",
                run["status"]["queue_bound_off"].as_str().unwrap_or("?")
            ),
            None => "—".to_owned(),
        };
        out += &format!(" {loads} | {bound} |");
        if run["expect"] == "Smoke" {
            out += &smoke_cells(run);
            continue;
        }
        for (_, prefixes) in TESTED {
            out += &format!(" {} |", tested(run, prefixes));
        }
        let failed = names(run, "failed_tests");
        out += &format!(
            " {} passed, {} failed{} |\n",
            run["passed"].as_u64().unwrap_or(0),
            run["failed"].as_u64().unwrap_or(0),
            if failed.is_empty() {
                String::new()
            } else {
                format!(" (`{}`)", failed.join("`, `"))
            }
        );
    }
    out
}

/// The runs on record, in the catalogue's order.
fn load_runs(dir: &Path) -> Result<Vec<Value>> {
    let mut runs = Vec::new();
    for k in KERNELS {
        let path = dir.join(format!("{}.json", k.name));
        if let Ok(text) = std::fs::read_to_string(&path) {
            runs.push(
                serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?,
            );
        }
    }
    Ok(runs)
}

/// `cargo xtask kernel-table`: rewrites the README's table from the results.
pub fn run() -> Result<()> {
    let runs = load_runs(&results_dir())?;
    if runs.is_empty() {
        bail!(
            "no results in {}: run cargo xtask test --kernel NAME first",
            results_dir().display()
        );
    }
    let table = render(&runs);
    let readme = workspace::root().join("README.md");
    let text = std::fs::read_to_string(&readme).context("read README.md")?;
    let (Some(a), Some(b)) = (text.find(START), text.find(END)) else {
        bail!("README.md has no {START} ... {END} markers");
    };
    let new = format!("{}{START}\n{table}{}", &text[..a], &text[b..]);
    std::fs::write(&readme, new).context("write README.md")?;
    print!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rows_say_what_ran_and_held() {
        let loads = json!({"kernel": "6.1", "note": "Debian 12", "release": "6.1.0-50-amd64",
            "expect": "Loads", "passed": 40, "failed": 1,
            "failed_tests": ["ulp_refused_on_bypassed_socket"],
            "passed_tests": ["datapath::ipv4_64mib_exact_and_redirected", "sigterm_mid_stream_loses_nothing"],
            "status": {"features": {"queue_bound": false},
                "queue_bound_off": "no msg_tot_len"}});
        let refuses = json!({"kernel": "5.10", "note": "Debian 11", "release": "5.10.0-32-amd64",
            "expect": "Refuses", "refusal": {"line": "error: kernel 5.10 is older than 5.15"}});
        let t = render(&[loads, refuses]);
        assert!(
            t.contains("| 6.1 (`6.1.0-50-amd64`) | Debian 12 | yes | off: no msg_tot_len |"),
            "{t}"
        );
        assert!(t.contains("**no** (ulp_refused_on_bypassed_socket)"), "{t}");
        assert!(
            t.contains("| yes | — | — | yes | — | — | **no**"),
            "a column whose tests did not run says so: {t}"
        );
        assert!(
            t.contains("refuses: `error: kernel 5.10 is older than 5.15`"),
            "{t}"
        );
        assert!(t.contains("40 passed, 1 failed (`ulp_refused_on_bypassed_socket`)"));
    }

    #[test]
    fn a_prefix_names_a_test_as_recorded_and_by_its_file() {
        let prefixes = ["go_io_copy", "splice_read_guarded"];
        for t in [
            "go_io_copy_echo_exact",
            "apps::go_io_copy_echo_exact",
            "apps::go::io_copy_echo_exact",
            "tcp_semantics::reading::splice_read_guarded_or_known_difference",
        ] {
            assert_eq!(
                tested(&json!({"passed_tests": [t]}), &prefixes),
                "yes",
                "{t}"
            );
        }
        let other = json!({"passed_tests": ["apps::go::read_write_echo_exact"]});
        assert_eq!(tested(&other, &prefixes), "—");
    }

    #[test]
    fn smoke_rows_claim_only_the_transfer() {
        let smoke = json!({"kernel": "6.1-arm64", "note": "arm64", "release": "6.1.0-50-arm64",
            "expect": "Smoke", "passed": 1, "failed": 0,
            "status": {"features": {"queue_bound": true}},
            "smoke": {"pass": true, "bytes": 4 << 20}});
        let t = render(&[smoke]);
        assert!(
            t.contains(
                "| yes | yes | IPv4 (smoke: 4 MiB each way, exact) | — | — | — | — | — | — | smoke \
                 test passed |"
            ),
            "{t}"
        );
    }
}
