//! The files of a run's results: the JSON, tables, plot and README snippet (the apps
//! scenario writes its own through [`write_files`]).

use std::path::{Path as FsPath, PathBuf};

use anyhow::{Context as _, Result};

use crate::model::{Results, Scenario};

/// Writes `bench.json`, `table.txt`, `table.md` and `plot.svg` into `dir`; a scenario
/// run also `readme-snippet.md` (its ratios, ready for results/README.md).
pub fn write_outputs(r: &Results, dir: &FsPath) -> Result<Vec<PathBuf>> {
    let mut files = vec![
        ("bench.json", serde_json::to_string_pretty(r)? + "\n"),
        ("table.txt", crate::report::render(r)),
        ("table.md", crate::report::render_markdown(r)),
        ("plot.svg", crate::plot::svg(r)),
    ];
    if r.config.scenario != Scenario::Default {
        files.push(("readme-snippet.md", crate::report::render_snippet(r)));
    }
    write_files(dir, &files)
}

/// Writes each `(name, text)` into `dir` (created); returns the paths written.
pub fn write_files(dir: &FsPath, files: &[(&str, String)]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
