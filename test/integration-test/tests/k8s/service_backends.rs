//! Service backends follow the Services and their EndpointSlices (with the
//! `--service-backend` flags): an endpoint on a pod of the agent's node enters the map
//! under the Service's ClusterIP and port, moves when the slice's address changes, and
//! leaves when the slice is deleted; an endpoint that is no pod of the node never enters.

use std::{cell::Cell, collections::BTreeSet, path::Path, time::Duration};

use anyhow::{Result, ensure};
use serde_json::json;
use testbed::{TwoPods, agent::http_get};

use super::{
    cluster::{Cluster, PodOpts},
    support::{addrs, free_port, node_name, set, start_agent, strings, wait_addrs, wait_for},
};

/// How long a change of the Services or EndpointSlices may take to reach the map:
/// generous, what is checked here is that the map follows them.
/// A net for each change to reach the maps (see `testbed::steps::NET`).
const DEADLINE: Duration = testbed::steps::NET;

/// A ClusterIP in the API server's service range (10.0.0.0/24, `kube-testenv`), not
/// the `kubernetes` Service's (10.0.0.1).
const CLUSTER_IP: &str = "10.0.0.42";

/// Given with `--service-backend`: in the map from the first listing on, whatever the
/// API says.
const FLAG: &str = "10.0.0.99:443=10.33.1.9:8443";

pub fn k8s_service_backends_follow_endpointslices() -> Result<()> {
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "sb");
    c.node(&node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    c.pod("bk-apps", "web", &node, &["10.33.1.7"], PodOpts::default())?;
    c.pod("bk-apps", "web2", &node, &["10.33.1.8"], PodOpts::default())?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &["--service-backend", FLAG])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pods in", &addrs(&["10.33.1.7", "10.33.1.8"]))?;
    // Set by the first poll that sees the flag's entry, cleared by any poll after that
    // does not.
    let flag = FlagWatch::default();
    flag.wait(&pin, "the flag once listed", &strings(&[FLAG]))?;

    // Port 80 to the pods' port named "web"; the slice names the port "http" as the
    // Service does, with the number the name resolves to. 10.33.9.9 is no pod of
    // this node.
    c.service(
        "bk-apps",
        "web",
        CLUSTER_IP,
        json!([{"name": "http", "port": 80, "targetPort": "web"}]),
    )?;
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    c.endpoint_slice(
        "bk-apps",
        "web-1",
        "web",
        &node,
        &["10.33.1.7", "10.33.9.9"],
        slice_ports,
    )?;
    flag.wait(
        &pin,
        "the node's endpoint in",
        &strings(&[FLAG, "10.0.0.42:80=10.33.1.7:8080"]),
    )?;

    c.endpoint_slice_addrs("bk-apps", "web-1", &node, &["10.33.1.8"])?;
    flag.wait(
        &pin,
        "the changed endpoint in, the old one out",
        &strings(&[FLAG, "10.0.0.42:80=10.33.1.8:8080"]),
    )?;

    c.delete_endpoint_slice("bk-apps", "web-1")?;
    flag.wait(&pin, "the deleted slice's endpoint out", &strings(&[FLAG]))?;
    ensure!(
        flag.held(),
        "the --service-backend entry left the map at some point"
    );
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    Ok(())
}

/// Whether the flag's entry, once seen in the map, stayed in it at every poll.
#[derive(Default)]
struct FlagWatch {
    seen: Cell<bool>,
    lost: Cell<bool>,
}

impl FlagWatch {
    /// Polls until the Service backends are `want`, noting the flag's entry each time.
    fn wait(&self, pin: &Path, what: &str, want: &BTreeSet<String>) -> Result<Duration> {
        wait_for(pin, DEADLINE, what, |s| {
            let have = set(&s.service_backends);
            if have.contains(FLAG) {
                self.seen.set(true);
            } else if self.seen.get() {
                self.lost.set(true);
            }
            have == *want
        })
    }

    fn held(&self) -> bool {
        self.seen.get() && !self.lost.get()
    }
}
