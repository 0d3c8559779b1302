//! One tool run at a time, in pod `a` pinned to the placement's client CPU: qperf,
//! sockperf and the Unix-socket floor, each into samples, with the progress line.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use testbed::spawn_in_on_cpus;

use super::{
    Observed, Run, SLACK, client_twice, qperf_data_port, qperf_port, qperf_what, record_qperf,
    sockperf_port,
};
use crate::{
    floor::FloorResult,
    model::{Counted, Path, PctSample, Placement, Sample, Test},
    qperf, sockperf,
};

impl Run<'_> {
    /// Runs `cmd` in pod `a` pinned to `cpu`, returning stdout; one retry on failure.
    fn client(
        &mut self,
        what: &str,
        make: &dyn Fn() -> Command,
        cpu: usize,
        secs: u32,
    ) -> Result<Option<String>> {
        let timeout = Duration::from_secs(u64::from(secs) * 2 + 5) + SLACK;
        let pod = &self.pods.a;
        client_twice(what, &mut self.raw, &mut self.results.warnings, || {
            let mut cmd = make();
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Ok(spawn_in_on_cpus(pod, cmd, &[cpu])?.wait_output(timeout))
        })
    }

    fn wire_and_stats(&self) -> (Option<u64>, Option<Counted>) {
        self.paths.wire_and_stats(&self.pods)
    }

    pub(super) fn qperf(&mut self, rep: u32, p: &Placement, path: Path, size: u32) -> Result<()> {
        let secs = self.results.config.qperf_secs;
        let (ip, port) = (self.server_ip, qperf_port(p.server_cpu));
        let data_port = self
            .setup
            .fixed_data_port
            .then(|| qperf_data_port(p.server_cpu));
        let tests = self.results.config.tests.clone();
        let at = (rep, p, path, size);
        let what = qperf_what(at);
        let (wire0, stats0) = self.wire_and_stats();
        let out = self.client(
            &what,
            &|| qperf::client_command(ip, port, data_port, size, secs, &tests),
            p.client_cpu,
            secs,
        )?;
        let observed = Observed::between((wire0, stats0), self.wire_and_stats());
        let line = record_qperf(&mut self.results, at, out.as_deref(), observed)
            .unwrap_or_else(|| format!("{what}: FAILED"));
        self.steps.tick(&line);
        Ok(())
    }

    pub(super) fn sockperf(
        &mut self,
        rep: u32,
        p: &Placement,
        path: Path,
        size: u32,
    ) -> Result<()> {
        let secs = self.results.config.sockperf_secs;
        let (ip, port) = (self.server_ip, sockperf_port(p.server_cpu));
        let what = format!("sockperf rep {rep} {} {} size {size}", p.name, path.name());
        let out = self.client(
            &what,
            &|| sockperf::client_command(ip, port, size, secs),
            p.client_cpu,
            secs,
        )?;
        let parsed = out.map(|o| sockperf::parse(&o));
        match parsed {
            Some(Ok(r)) => {
                let sample = PctSample::new(rep, &p.name, path, size, r);
                self.results.percentiles.push(sample);
                self.steps.tick(&format!(
                    "{what}: p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us",
                    r.p50_ns / 1e3,
                    r.p99_ns / 1e3,
                    r.p999_ns / 1e3
                ));
            }
            Some(Err(e)) => {
                self.results.warnings.push(format!("{what}: {e:#}"));
                self.steps.tick(&format!("{what}: unparsable"));
            }
            None => self.steps.tick(&format!("{what}: FAILED")),
        }
        Ok(())
    }

    pub(super) fn floor(
        &mut self,
        rep: u32,
        p: &Placement,
        size: u32,
        with_pct: bool,
    ) -> Result<()> {
        let secs = self.results.config.floor_secs;
        let (mut lat, mut bw) = (None, None);
        for test in [Test::TcpLat, Test::TcpBw] {
            let what = format!("floor rep {rep} {} {} size {size}", p.name, test.name());
            match floor_once(test, size, secs, p) {
                Ok(r) => (lat, bw) = (lat.or(r.latency), bw.or(r.bw_bytes_per_sec)),
                Err(e) => self.results.warnings.push(format!("{what}: {e:#}")),
            }
        }
        let lat_ns = lat.map(|l| l.avg_ns);
        for (test, value) in [(Test::TcpLat, lat_ns), (Test::TcpBw, bw)] {
            if let Some(value) = value {
                let sample = Sample::bare(rep, &p.name, Path::Floor, test, size, value);
                self.results.samples.push(sample);
            }
        }
        if with_pct
            && self.results.config.sockperf_sizes.contains(&size)
            && let Some(l) = lat
        {
            let sample = PctSample::new(rep, &p.name, Path::Floor, size, l);
            self.results.percentiles.push(sample);
        }
        self.steps.tick(&format!(
            "floor rep {rep} {} size {size}: lat {}, bw {}",
            p.name,
            lat_ns.map_or_else(|| "-".into(), |v| format!("{:.2} us", v / 1e3)),
            bw.map_or_else(|| "-".into(), |v| format!("{:.1} MB/s", v / 1e6)),
        ));
        Ok(())
    }
}

/// Runs `bypass-bench floor ...` (this executable) and parses its JSON line.
fn floor_once(test: Test, size: u32, secs: f64, p: &Placement) -> Result<FloorResult> {
    let exe = std::env::current_exe().context("find our own executable")?;
    let out = Command::new(exe)
        .args([
            "floor",
            "--test",
            test.name(),
            "--size",
            &size.to_string(),
            "--secs",
            &secs.to_string(),
            "--client-cpu",
            &p.client_cpu.to_string(),
            "--server-cpu",
            &p.server_cpu.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .context("run the floor")?;
    if !out.status.success() {
        bail!(
            "floor failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("parse the floor's output")
}
