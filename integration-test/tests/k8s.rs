//! The Kubernetes agent against a real kube-apiserver and etcd (built and started by
//! the `kube-testenv` crate, one pair per test): pod addresses follow Pod objects into
//! and out of the maps within a second (IPv4 and IPv6), ineligible pods never enter,
//! traffic between two netns "pods" whose addresses come only from Pod objects is
//! redirected, the node label switches it off and on without losing a byte, the
//! datapath survives the API server going away and the maps match the API when it is
//! back, bad input fails clearly, and every manifest in `deploy/` is accepted. Service
//! CIDRs follow the ServiceCIDR objects (with the `--service-cidr` flags), a malformed
//! one (written to etcd, as an older API server could have stored it) does not stop pod
//! sync, and without RBAC for them the agent falls back to the flags and recovers.
//!
//! Objects are made as a kubelet and controllers would: status through the status
//! subresource, pods force-deleted, the `default` ServiceAccount created by hand.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::{IpAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, ServiceAccount},
    networking::v1::ServiceCIDR,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    discovery::Scope,
};
use kube_testenv::KubeEnv;
use serde_json::{Value, json};
use support::exchange::{assert_bypassed, assert_byte_exact, exchange};
use testbed::{
    Agent, AgentOpts, AgentStatus, ClientArgs, PeerClient, PeerServer, Proxy, ProxyOpts, TwoPods,
    agent::{http_get, metric},
    iptables::{self, Family},
    preflight, run_client,
};

/// "Within a second": how long a change in the API may take to reach the maps.
const PROPAGATION: Duration = Duration::from_secs(1);
const LABEL: &str = "bypass.dev/enabled";
const EXCLUDE: &str = "bypass.dev/exclude";
const MANAGER: &str = "bypass-test";

/// A real API server for one test, and an admin client on it.
struct Cluster {
    // Dropped last: the runtime and client go before the server.
    rt: tokio::runtime::Runtime,
    client: Client,
    env: KubeEnv,
}

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

impl Cluster {
    fn start() -> Result<Self> {
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("bk-kube-{}-{n}", std::process::id()));
        let started = Instant::now();
        let env = KubeEnv::start(&dir)?;
        eprintln!(
            "api server {} ready in {:.1?}",
            env.server(),
            started.elapsed()
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(client_for(&env.kubeconfig()))?;
        Ok(Self { rt, client, env })
    }

    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A Node with these pod CIDRs and labels.
    fn node(&self, name: &str, cidrs: &[&str], labels: &[(&str, &str)]) -> Result<()> {
        let labels: BTreeMap<_, _> = labels.iter().copied().collect();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
        }))?;
        self.block(self.nodes().create(&PostParams::default(), &node))
            .with_context(|| format!("create node {name}"))?;
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) a node label.
    fn label_node(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.block(
            self.nodes()
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .with_context(|| format!("label node {name} {key}={value:?}"))?;
        Ok(())
    }

    /// A namespace with labels, and its `default` ServiceAccount (no controller makes it).
    fn namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        let labels: BTreeMap<_, _> = labels.iter().copied().collect();
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
        self.block(Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns))
            .with_context(|| format!("create namespace {name}"))?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
        self.block(
            Api::<ServiceAccount>::namespaced(self.client.clone(), name)
                .create(&PostParams::default(), &sa),
        )
        .with_context(|| format!("create serviceaccount {name}/default"))?;
        Ok(())
    }

    fn label_namespace(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.block(Api::<Namespace>::all(self.client.clone()).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(patch),
        ))?;
        Ok(())
    }

    /// A pod scheduled on `node` (set directly: no scheduler runs), then given `ips`
    /// through the status subresource as a kubelet would.
    fn pod(&self, ns: &str, name: &str, node: &str, ips: &[&str], opts: PodOpts) -> Result<()> {
        let annotations: BTreeMap<_, _> = opts.annotations.iter().copied().collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeName": node,
                "hostNetwork": opts.host_network,
                "containers": [{"name": "c", "image": "bypass.invalid/none:0"}],
            },
        }))?;
        self.block(self.pods(ns).create(&PostParams::default(), &pod))
            .with_context(|| format!("create pod {ns}/{name}"))?;
        self.pod_ips(ns, name, ips, "Running")
    }

    fn pod_ips(&self, ns: &str, name: &str, ips: &[&str], phase: &str) -> Result<()> {
        let list: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        let patch = json!({"status": {"phase": phase, "podIP": ips.first(), "podIPs": list}});
        self.block(
            self.pods(ns)
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .with_context(|| format!("set status of pod {ns}/{name}"))?;
        Ok(())
    }

    fn annotate_pod(&self, ns: &str, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.block(
            self.pods(ns)
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )?;
        Ok(())
    }

    /// Force delete, as `kubectl delete --grace-period=0 --force`.
    fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.block(self.pods(ns).delete(name, &dp))
            .with_context(|| format!("delete pod {ns}/{name}"))?;
        Ok(())
    }

    fn service_cidrs(&self) -> Api<ServiceCIDR> {
        Api::all(self.client.clone())
    }

    /// A ServiceCIDR, as an administrator adds one (no controller sets it Ready).
    fn service_cidr(&self, name: &str, cidrs: &[&str]) -> Result<()> {
        let sc: ServiceCIDR = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"cidrs": cidrs},
        }))?;
        self.block(self.service_cidrs().create(&PostParams::default(), &sc))
            .with_context(|| format!("create servicecidr {name}"))?;
        Ok(())
    }

    fn delete_service_cidr(&self, name: &str) -> Result<()> {
        self.block(self.service_cidrs().delete(name, &DeleteParams::default()))
            .with_context(|| format!("delete servicecidr {name}"))?;
        Ok(())
    }

    /// Stores a ServiceCIDR straight into etcd, bypassing validation: what an older API
    /// server with laxer validation could have left (today's refuses host bits).
    fn service_cidr_in_etcd(&self, name: &str, cidrs: &[&str]) -> Result<()> {
        let obj = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {
                "name": name,
                "uid": "6b8f4a52-0000-4000-8000-00000000bad1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"cidrs": cidrs},
        });
        etcd_put(
            &etcd_url(&self.env)?,
            &format!("/registry/servicecidrs/{name}"),
            &obj.to_string(),
        )
    }

    /// Server-side applies every object of a YAML file (`dry_run`: validated and
    /// admitted, not stored).
    fn apply_yaml(&self, path: &Path, dry_run: bool) -> Result<Vec<String>> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("parse {}", path.display()))?;
        let mut applied = Vec::new();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let obj: DynamicObject = serde_json::from_value(doc)?;
            let types = obj
                .types
                .clone()
                .context("object without apiVersion/kind")?;
            let gvk = GroupVersionKind::try_from(&types)?;
            let name = obj.metadata.name.clone().context("object without a name")?;
            let (ar, caps) = self.block(kube::discovery::pinned_kind(&self.client, &gvk))?;
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => {
                    let ns = obj
                        .metadata
                        .namespace
                        .clone()
                        .context("namespaced object without a namespace")?;
                    Api::namespaced_with(self.client.clone(), &ns, &ar)
                }
                Scope::Cluster => Api::all_with(self.client.clone(), &ar),
            };
            let mut pp = PatchParams::apply(MANAGER).force();
            if dry_run {
                pp = pp.dry_run();
            }
            self.block(api.patch(&name, &pp, &Patch::Apply(&obj)))
                .with_context(|| {
                    format!(
                        "apply {} {name} from {} (dry run: {dry_run})",
                        types.kind,
                        path.display()
                    )
                })?;
            applied.push(format!("{}/{name}", types.kind));
        }
        Ok(applied)
    }
}

#[derive(Default, Clone, Copy)]
struct PodOpts<'a> {
    host_network: bool,
    annotations: &'a [(&'a str, &'a str)],
}

async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Agent options for Kubernetes mode: no `--pod-cidr`, everything from the API.
fn kube_agent_opts(
    pods: &TwoPods,
    node: &str,
    kubeconfig: &Path,
    metrics_port: u16,
    extra: &[&str],
) -> AgentOpts {
    let mut opts = pods.agent_opts();
    opts.pod_cidrs.clear();
    opts.extra_args = [
        "--node-name".to_owned(),
        node.to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig.display().to_string(),
        "--metrics-addr".to_owned(),
        format!("127.0.0.1:{metrics_port}"),
    ]
    .into_iter()
    .chain(extra.iter().map(|s| (*s).to_owned()))
    .collect();
    opts
}

/// The etcd client URL of this cluster's API server, from its command line.
fn etcd_url(env: &KubeEnv) -> Result<String> {
    let marker = format!(
        "--tls-cert-file={}",
        env.dir().join("pki").join("server.crt").display()
    );
    for entry in std::fs::read_dir("/proc")? {
        let Ok(cmdline) = std::fs::read(entry?.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.contains(&marker)
            && let Some(url) = args.iter().find_map(|a| a.strip_prefix("--etcd-servers="))
        {
            return Ok(url.to_owned());
        }
    }
    bail!("no kube-apiserver running with {marker}")
}

/// `put key value` through etcd's JSON gateway (`/v3/kv/put`, keys and values base64).
fn etcd_put(url: &str, key: &str, value: &str) -> Result<()> {
    let addr = url
        .strip_prefix("http://")
        .with_context(|| format!("etcd at {url}: expected http://"))?;
    let body =
        json!({"key": base64(key.as_bytes()), "value": base64(value.as_bytes())}).to_string();
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect to etcd {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "POST /v3/kv/put HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    ensure!(
        answer.starts_with("HTTP/1.1 200"),
        "etcd put {key}: {answer}"
    );
    Ok(())
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn strings(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn addrs(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().filter_map(|s| s.parse().ok()).collect()
}

/// The agent's maps and toggle state, read from its pins by `bypass-agent status`.
#[derive(Debug)]
struct Seen {
    attached: bool,
    cidrs: BTreeSet<String>,
    addrs: BTreeSet<IpAddr>,
    excluded: BTreeSet<IpAddr>,
    service_cidrs: BTreeSet<String>,
    enabled_by: Value,
    label_value: Value,
}

fn seen(pin_dir: &Path) -> Result<Seen> {
    let v = testbed::agent::status_json(pin_dir)?;
    let strings = |k: &str| -> Vec<String> {
        v[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(Seen {
        attached: v["attached"].as_bool().unwrap_or(false),
        cidrs: strings("pod_cidrs").into_iter().collect(),
        addrs: strings("pod_addresses")
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect(),
        excluded: strings("excluded_addresses")
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect(),
        service_cidrs: strings("service_cidrs").into_iter().collect(),
        enabled_by: v["enabled_by"].clone(),
        label_value: v["label_value"].clone(),
    })
}

/// Polls `status` until `ok` holds; fails after `timeout`. Returns how long it took.
fn wait_for(
    pin_dir: &Path,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&Seen) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let s = seen(pin_dir)?;
        if ok(&s) {
            let took = started.elapsed();
            eprintln!("  {what}: {took:.0?}");
            return Ok(took);
        }
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}; the agent has {s:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_addrs(pin_dir: &Path, what: &str, want: &BTreeSet<IpAddr>) -> Result<Duration> {
    wait_for(pin_dir, PROPAGATION, what, |s| &s.addrs == want)
}

fn wait_service_cidrs(pin_dir: &Path, what: &str, want: &BTreeSet<String>) -> Result<Duration> {
    wait_for(pin_dir, PROPAGATION, what, |s| &s.service_cidrs == want)
}

/// Lines of the agent's log that contain every one of `words`.
fn log_lines(agent: &Agent, words: &[&str]) -> usize {
    agent
        .stderr()
        .lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

/// A node name of this test run.
fn node_name(pods: &TwoPods, what: &str) -> String {
    format!("bk-{}-{what}", pods.tag())
}

#[test]
fn k8s_pod_addresses_follow_the_api() -> Result<()> {
    if !preflight("k8s_pod_addresses_follow_the_api")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n1");
    let other = node_name(&pods, "n2");
    c.node(&node, &["10.77.1.0/24", "fd77:1::/64"], &[])?;
    c.node(&other, &["10.77.2.0/24"], &[])?;
    c.namespace("bk-apps", &[])?;
    c.namespace("bk-quiet", &[(EXCLUDE, "true")])?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &[],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_for(&pin, PROPAGATION, "attached by default", |s| {
        s.attached && s.enabled_by == "default"
    })?;
    let s = seen(&pin)?;
    ensure!(s.label_value == "absent", "{s:#?}");
    // The node's podCIDRs never enter the trie: an address there is a pod's only once
    // a Pod object of this node says so (not opted out, not on the host network).
    ensure!(s.cidrs.is_empty(), "node podCIDRs in the trie: {s:#?}");
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    ensure!(http_get(port, "/healthz")?.0 == 200, "not healthy");

    // Dual-stack pod: both addresses in; an address change moves them.
    c.pod(
        "bk-apps",
        "web",
        &node,
        &["10.77.1.5", "fd77:1::5"],
        PodOpts::default(),
    )?;
    wait_addrs(
        &pin,
        "v4+v6 pod addresses in",
        &addrs(&["10.77.1.5", "fd77:1::5"]),
    )?;
    c.pod_ips("bk-apps", "web", &["10.77.1.6", "fd77:1::6"], "Running")?;
    wait_addrs(
        &pin,
        "changed addresses moved",
        &addrs(&["10.77.1.6", "fd77:1::6"]),
    )?;
    c.pod(
        "bk-apps",
        "v6only",
        &node,
        &["fd77:1::7"],
        PodOpts::default(),
    )?;
    wait_addrs(
        &pin,
        "IPv6-only pod in",
        &addrs(&["10.77.1.6", "fd77:1::6", "fd77:1::7"]),
    )?;

    // Pods that must never enter; a sentinel after them proves they were processed.
    c.pod(
        "bk-apps",
        "host",
        &node,
        &["192.0.2.10"],
        PodOpts {
            host_network: true,
            ..PodOpts::default()
        },
    )?;
    c.pod(
        "bk-apps",
        "elsewhere",
        &other,
        &["10.77.2.5"],
        PodOpts::default(),
    )?;
    c.pod(
        "bk-apps",
        "optout",
        &node,
        &["10.77.1.8"],
        PodOpts {
            annotations: &[(EXCLUDE, "true")],
            ..PodOpts::default()
        },
    )?;
    c.pod(
        "bk-quiet",
        "quiet",
        &node,
        &["10.77.1.9"],
        PodOpts::default(),
    )?;
    // Legacy validation lets the API server store an IPv4 with leading zeros; the
    // agent rejects that one address (logged, counted) and keeps the pod's other one.
    c.pod(
        "bk-apps",
        "odd",
        &node,
        &["10.77.1.010", "fd77:1::10"],
        PodOpts::default(),
    )?;
    c.pod(
        "bk-apps",
        "sentinel",
        &node,
        &["10.77.1.11"],
        PodOpts::default(),
    )?;
    let mut want = addrs(&[
        "10.77.1.6",
        "fd77:1::6",
        "fd77:1::7",
        "fd77:1::10",
        "10.77.1.11",
    ]);
    wait_addrs(&pin, "sentinel in, ineligible pods out", &want)?;
    // Opted-out and host-network pods' addresses are excluded whatever CIDR covers
    // them; the other node's pod is simply not this node's business.
    ensure!(
        seen(&pin)?.excluded == addrs(&["192.0.2.10", "10.77.1.8", "10.77.1.9"]),
        "excluded addresses: {:#?}",
        seen(&pin)?
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"pod_address\"}")? >= 1.0,
        "malformed address not counted"
    );
    ensure!(metric(port, "bypass_pods_tracked")? == 4.0, "pods_tracked");

    // Opt-out by annotation and by namespace label, live, and back.
    c.annotate_pod("bk-apps", "web", EXCLUDE, Some("true"))?;
    let without_web: BTreeSet<IpAddr> = want
        .difference(&addrs(&["10.77.1.6", "fd77:1::6"]))
        .copied()
        .collect();
    wait_addrs(&pin, "annotated pod out", &without_web)?;
    ensure!(
        seen(&pin)?.excluded.contains(&"10.77.1.6".parse()?),
        "annotated pod not excluded"
    );
    c.annotate_pod("bk-apps", "web", EXCLUDE, None)?;
    wait_addrs(&pin, "annotation removed, pod back", &want)?;
    c.label_namespace("bk-apps", EXCLUDE, Some("true"))?;
    wait_addrs(&pin, "namespace opted out", &BTreeSet::new())?;
    c.label_namespace("bk-quiet", EXCLUDE, Some("false"))?;
    c.label_namespace("bk-apps", EXCLUDE, None)?;
    want.insert("10.77.1.9".parse()?);
    wait_addrs(&pin, "namespaces opted in", &want)?;

    // Finished and deleted pods leave.
    c.pod_ips("bk-apps", "sentinel", &["10.77.1.11"], "Succeeded")?;
    want.remove(&"10.77.1.11".parse()?);
    wait_addrs(&pin, "finished pod out", &want)?;
    c.delete_pod("bk-apps", "v6only")?;
    want.remove(&"fd77:1::7".parse()?);
    wait_addrs(&pin, "deleted pod out", &want)?;

    // A node edit changes no map.
    c.block(c.nodes().patch(
        &node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    ))?;
    std::thread::sleep(Duration::from_millis(200));
    let s = seen(&pin)?;
    ensure!(
        s.cidrs.is_empty() && s.addrs == want,
        "maps changed by a label edit: {s:#?}"
    );
    Ok(())
}

#[test]
fn k8s_traffic_from_pod_objects_and_label_toggle_lose_no_byte() -> Result<()> {
    if !preflight("k8s_traffic_from_pod_objects_and_label_toggle_lose_no_byte")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    // No pod CIDRs on the node, none on the command line: only Pod objects count.
    c.node(&node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    let (a4, a6, b4, b6) = (
        pods.a.ipv4().to_string(),
        pods.a.ipv6().to_string(),
        pods.b.ipv4().to_string(),
        pods.b.ipv6().to_string(),
    );
    c.pod("bk-apps", "a", &node, &[&a4, &a6], PodOpts::default())?;
    c.pod("bk-apps", "b", &node, &[&b4, &b6], PodOpts::default())?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &[],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(
        &pin,
        "both pods' addresses in",
        &addrs(&[&a4, &a6, &b4, &b6]),
    )?;
    ensure!(seen(&pin)?.cidrs.is_empty(), "no CIDRs expected");
    ensure!(
        metric(port, "bypass_pod_addresses")? == 4.0,
        "map size metric"
    );
    ensure!(metric(port, "bypass_pod_cidrs")? == 0.0, "trie size metric");
    ensure!(
        metric(port, "bypass_pods_tracked")? == 2.0,
        "pods tracked metric"
    );
    ensure!(metric(port, "bypass_synced")? == 1.0, "synced metric");

    let bulk = ClientArgs::bulk(16 << 20);
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5101),
        pods.b.v4_addr(5101),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)?;
    let x = exchange(
        &pods,
        &agent,
        pods.b.v6_addr(5102),
        pods.b.v6_addr(5102),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)?;

    ensure!(metric(port, "bypass_attached")? == 1.0, "attached metric");
    ensure!(
        metric(port, "bypass_redirected_bytes_total{kind=\"pod\"}")? >= f64::from(4 * (16 << 20)),
        "redirected bytes metric"
    );

    // Label off: the normal path, byte-exact.
    c.label_node(&node, LABEL, Some("false"))?;
    wait_for(&pin, PROPAGATION, "label=false detaches", |s| {
        !s.attached && s.enabled_by == "label" && s.label_value == "false"
    })?;
    ensure!(
        http_get(port, "/readyz")?.0 == 200,
        "deliberately off must still be ready"
    );
    ensure!(
        metric(port, "bypass_attached")? == 0.0,
        "attached metric while off"
    );
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5103),
        pods.b.v4_addr(5103),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0,
        "redirected while off: {x:#?}"
    );
    ensure!(
        x.wire >= 2 * (16 << 20),
        "off, yet the wire carried only {} B",
        x.wire
    );

    // Label on again: redirected again.
    c.label_node(&node, LABEL, Some("true"))?;
    wait_for(&pin, PROPAGATION, "label=true attaches", |s| {
        s.attached && s.enabled_by == "label"
    })?;
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5104),
        pods.b.v4_addr(5104),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)?;

    // A bad value is logged and counted, and the state is kept.
    c.label_node(&node, LABEL, Some("maybe"))?;
    wait_for(&pin, PROPAGATION, "bad label value seen", |s| {
        s.label_value == "invalid"
    })?;
    ensure!(
        seen(&pin)?.attached,
        "a bad label value must keep the bypass on"
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"label_value\"}")? == 1.0,
        "bad label not counted once"
    );
    c.label_node(&node, LABEL, None)?;
    wait_for(&pin, PROPAGATION, "label removed: default", |s| {
        s.attached && s.enabled_by == "default"
    })?;

    // Switch off and on while bytes flow, both ways, on live connections: none lost.
    let flow = ClientArgs {
        send: 24 << 20,
        recv: 24 << 20,
        streams: 2,
        msg_size: 16 << 10,
        rate: 8 << 20,
        ..ClientArgs::default()
    };
    let before = agent.stats()?;
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5105), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5105), &flow)?;
    for value in ["false", "true", "false", "true"] {
        std::thread::sleep(Duration::from_millis(600));
        c.label_node(&node, LABEL, Some(value))?;
        let on = value == "true";
        wait_for(
            &pin,
            PROPAGATION,
            &format!("label={value} while streaming"),
            |s| s.attached == on,
        )?;
    }
    let client = client.wait()?;
    let server = server.wait()?;
    ensure!(
        client.ok && server.ok,
        "bytes lost or corrupted across switches: {client:#?} {server:#?}"
    );
    let n = flow.total_connections();
    ensure!(
        server.bytes_received == n * flow.send && client.bytes_received == n * flow.recv,
        "short: {client:#?} {server:#?}"
    );
    // The live connections really switched: part redirected, part (after the first
    // switch off) on the TCP path.
    let after = agent.stats()?;
    ensure!(
        after.counters.redirected_bytes > before.counters.redirected_bytes,
        "nothing redirected: {after:?}"
    );
    ensure!(
        after.counters.passed_bytes > before.counters.passed_bytes,
        "nothing took the TCP path: {after:?}"
    );

    // And new connections are bypassed after the last switch on.
    let x = exchange(
        &pods,
        &agent,
        pods.b.v6_addr(5106),
        pods.b.v6_addr(5106),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)
}

#[test]
fn k8s_api_server_outage_keeps_datapath_then_resyncs() -> Result<()> {
    if !preflight("k8s_api_server_outage_keeps_datapath_then_resyncs")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let mut c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod("bk-apps", "a", &node, &[&a4], PodOpts::default())?;
    c.pod("bk-apps", "b", &node, &[&b4], PodOpts::default())?;
    c.pod(
        "bk-apps",
        "gone-later",
        &node,
        &["10.66.0.60"],
        PodOpts::default(),
    )?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &[],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    let before = addrs(&[&a4, &b4, "10.66.0.60"]);
    wait_addrs(&pin, "addresses in", &before)?;
    let second = c.env.start_second_apiserver()?;
    let c2 = c.block(client_for(&second))?;

    c.env.stop_apiserver()?;
    let watch_errors = |p| metric(p, "bypass_reconcile_errors_total{kind=\"watch\"}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch_errors(port)? < 1.0 {
        ensure!(
            Instant::now() < deadline,
            "the agent did not notice the API server going away"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Meanwhile, through a second API server on the same etcd: one pod goes, one comes.
    let pods2: Api<Pod> = Api::namespaced(c2.clone(), "bk-apps");
    c.block(pods2.delete(
        "gone-later",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    ))?;
    let new: Pod = serde_json::from_value(json!({
        "metadata": {"name": "new"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "bypass.invalid/none:0"}]},
    }))?;
    c.block(pods2.create(&PostParams::default(), &new))?;
    c.block(pods2.patch_status(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.66.0.61", "podIPs": [{"ip": "10.66.0.61"}]}})),
    ))?;

    // The datapath keeps working and keeps what it had.
    let bulk = ClientArgs::bulk(16 << 20);
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5201),
        pods.b.v4_addr(5201),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)?;
    let s = seen(&pin)?;
    ensure!(
        s.attached && s.addrs == before,
        "changed while the API server was away: {s:#?}"
    );
    ensure!(
        http_get(port, "/healthz")?.0 == 200,
        "an API outage must not fail liveness"
    );

    // Back: the agent relists and matches the API.
    c.env.start_apiserver()?;
    drop(c2);
    wait_for(
        &pin,
        Duration::from_secs(60),
        "maps match the API after the outage",
        |s| s.addrs == addrs(&[&a4, &b4, "10.66.0.61"]),
    )?;
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5202),
        pods.b.v4_addr(5202),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    assert_bypassed(&x, &bulk)
}

#[test]
fn k8s_agent_waits_for_an_absent_api_server() -> Result<()> {
    if !preflight("k8s_agent_waits_for_an_absent_api_server")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let mut c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &["10.44.0.0/24"], &[])?;
    c.namespace("bk-apps", &[])?;
    c.pod("bk-apps", "p", &node, &["10.44.0.5"], PodOpts::default())?;
    c.env.stop_apiserver()?;
    let port = free_port()?;
    let opts = kube_agent_opts(&pods, &node, &c.env.kubeconfig(), port, &[]);
    std::thread::scope(|s| -> Result<()> {
        // Agent::start returns once the datapath is attached.
        let starting = s.spawn(|| Agent::start(&opts));
        std::thread::sleep(Duration::from_secs(3));
        ensure!(
            !starting.is_finished(),
            "the agent gave up while the API server was away"
        );
        ensure!(
            http_get(port, "/healthz")?.0 == 200,
            "not live while waiting"
        );
        ensure!(
            http_get(port, "/readyz")?.0 == 503,
            "ready without an API server"
        );
        ensure!(
            !opts.pin_dir.exists(),
            "datapath loaded before the API server answered"
        );
        c.env.start_apiserver()?;
        let agent = starting
            .join()
            .map_err(|_| anyhow::anyhow!("agent start panicked"))??;
        wait_for(
            agent.pin_dir(),
            PROPAGATION,
            "pod address once the API server is up",
            |s| s.addrs.len() == 1,
        )?;
        ensure!(
            http_get(port, "/readyz")?.0 == 200,
            "not ready after the API server came up"
        );
        Ok(())
    })
}

/// Starts the agent expecting it to fail; returns its stderr. No datapath may be left.
fn agent_fails(opts: &AgentOpts, env: &[(&str, Option<&str>)]) -> Result<String> {
    let mut cmd = testbed::agent::agent_command();
    cmd.args(opts.args())
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let started = Instant::now();
    let out = cmd.output().context("run bypass-agent")?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(!out.status.success(), "the agent did not fail: {stderr}");
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?} to fail",
        started.elapsed()
    );
    ensure!(
        !opts.pin_dir.exists(),
        "a failed start left {}",
        opts.pin_dir.display()
    );
    eprintln!("  {}", stderr.lines().last().unwrap_or(""));
    Ok(stderr)
}

#[test]
fn k8s_bad_input_fails_with_the_fix_and_deploy_rbac_suffices() -> Result<()> {
    if !preflight("k8s_bad_input_fails_with_the_fix_and_deploy_rbac_suffices")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &["10.55.0.0/24"], &[])?;
    c.namespace("bk-apps", &[])?;
    c.pod("bk-apps", "p", &node, &["10.55.0.5"], PodOpts::default())?;
    let admin = c.env.kubeconfig();
    let port = free_port()?;

    // Missing node name.
    let mut opts = kube_agent_opts(&pods, &node, &admin, port, &[]);
    opts.extra_args.drain(0..2);
    let err = agent_fails(&opts, &[])?;
    ensure!(
        err.contains("no node name") && err.contains("NODE_NAME"),
        "{err}"
    );
    let err = agent_fails(&opts, &[("NODE_NAME", Some(""))])?;
    ensure!(err.contains("no node name"), "{err}");

    // Unreadable and malformed kubeconfigs.
    let err = agent_fails(
        &kube_agent_opts(
            &pods,
            &node,
            Path::new("/nonexistent/kubeconfig"),
            port,
            &[],
        ),
        &[],
    )?;
    ensure!(
        err.contains("cannot use the kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
    let garbage = c.env.dir().join("garbage.kubeconfig");
    std::fs::write(&garbage, "clusters: [[[")?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &garbage, port, &[]), &[])?;
    ensure!(err.contains("cannot use the kubeconfig"), "{err}");

    // A Node that does not exist.
    let err = agent_fails(
        &kube_agent_opts(&pods, "bk-no-such-node", &admin, port, &[]),
        &[],
    )?;
    ensure!(err.contains("node bk-no-such-node does not exist"), "{err}");

    // RBAC: nothing granted, then everything but watch.
    let nobody = c.env.user_kubeconfig("bk-nobody", &[])?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &nobody, port, &[]), &[])?;
    ensure!(
        err.contains("forbids the agent to get nodes") && err.contains("deploy/rbac.yaml"),
        "{err}"
    );
    let nowatch = c.env.user_kubeconfig("bk-nowatch", &[])?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "bk-nowatch"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list"]}],
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bk-nowatch"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bk-nowatch"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bk-nowatch"}],
    }))?;
    c.block(Api::<ClusterRole>::all(c.client.clone()).create(&PostParams::default(), &role))?;
    c.block(
        Api::<ClusterRoleBinding>::all(c.client.clone()).create(&PostParams::default(), &binding),
    )?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &nowatch, port, &[]), &[])?;
    ensure!(err.contains("forbids the agent to watch nodes"), "{err}");

    // The ServiceAccount with exactly deploy/'s RBAC is enough.
    let deploy = deploy_dir();
    for f in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"] {
        c.apply_yaml(&deploy.join(f), false)?;
    }
    let sa = c.env.user_kubeconfig(
        "system:serviceaccount:bypass-system:bypass-agent",
        &["system:serviceaccounts"],
    )?;
    let agent = Agent::start(&kube_agent_opts(&pods, &node, &sa, port, &[]))?;
    wait_for(
        agent.pin_dir(),
        PROPAGATION,
        "pod address with deploy RBAC",
        |s| s.addrs.len() == 1,
    )?;
    // ServiceCIDRs too: the default one, from --service-cluster-ip-range.
    wait_service_cidrs(
        agent.pin_dir(),
        "ServiceCIDRs with deploy RBAC",
        &strings(&["10.0.0.0/24"]),
    )?;
    ensure!(
        http_get(port, "/readyz")?.0 == 200,
        "not ready with deploy RBAC"
    );
    ensure!(
        log_lines(&agent, &["forbids"]) == 0,
        "deploy RBAC is not enough: {}",
        agent.stderr()
    );
    Ok(())
}

#[test]
fn k8s_service_cidrs_follow_the_api() -> Result<()> {
    if !preflight("k8s_service_cidrs_follow_the_api")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &["10.33.1.0/24"], &[])?;
    c.namespace("bk-apps", &[])?;
    let port = free_port()?;
    let flags = [
        "--service-cidr",
        "10.96.0.0/16",
        "--service-cidr",
        "fd00:96::/112",
    ];
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &flags,
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    // The default ServiceCIDR `kubernetes` (the API server's --service-cluster-ip-range)
    // and the flags.
    let mut want = strings(&["10.0.0.0/24", "10.96.0.0/16", "fd00:96::/112"]);
    wait_service_cidrs(&pin, "default ServiceCIDR and the flags", &want)?;
    ensure!(
        seen(&pin)?.cidrs.is_empty(),
        "node podCIDRs must not enter the trie"
    );

    // Added: counts at once, Ready or not (no controller here sets Ready), dual-stack.
    c.service_cidr("bk-extra", &["10.1.0.0/16", "fd00:1::/112"])?;
    want.extend(strings(&["10.1.0.0/16", "fd00:1::/112"]));
    wait_service_cidrs(&pin, "added ServiceCIDR in", &want)?;
    // One equal to a flag, then deleted: the flag's range stays.
    // (One watch stream delivers in order: once bk-extra is seen gone, so is bk-same.)
    c.service_cidr("bk-same", &["10.96.0.0/16"])?;
    c.delete_service_cidr("bk-same")?;
    c.delete_service_cidr("bk-extra")?;
    want.remove("10.1.0.0/16");
    want.remove("fd00:1::/112");
    wait_service_cidrs(&pin, "deleted ServiceCIDRs out, flags kept", &want)?;

    // Malformed, as an older API server could have stored it: the bad range is
    // rejected (logged once, counted), the object's other range counts, and pod sync
    // goes on.
    let before = metric(port, "bypass_reconcile_errors_total{kind=\"service_cidr\"}")?;
    c.service_cidr_in_etcd("bk-legacy", &["10.9.0.5/16", "fd00:9::/112"])?;
    want.insert("fd00:9::/112".to_owned());
    wait_service_cidrs(&pin, "legacy ServiceCIDR's good range in", &want)?;
    c.pod("bk-apps", "web", &node, &["10.33.1.5"], PodOpts::default())?;
    wait_addrs(&pin, "pod sync goes on", &addrs(&["10.33.1.5"]))?;
    c.delete_service_cidr("bk-legacy")?;
    want.remove("fd00:9::/112");
    wait_service_cidrs(&pin, "legacy ServiceCIDR deleted", &want)?;
    ensure!(
        log_lines(
            &agent,
            &["rejected", "servicecidr bk-legacy", "10.9.0.5/16"]
        ) == 1,
        "the malformed range is not logged once: {}",
        agent.stderr()
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"service_cidr\"}")? == before + 1.0,
        "the malformed range is not counted once"
    );
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    Ok(())
}

#[test]
fn k8s_service_cidrs_forbidden_fall_back_to_the_flags() -> Result<()> {
    if !preflight("k8s_service_cidrs_forbidden_fall_back_to_the_flags")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    c.pod("bk-apps", "a", &node, &["10.34.0.5"], PodOpts::default())?;
    // What deploy/rbac.yaml granted before ServiceCIDRs: nodes, pods, namespaces.
    let user = "bk-core";
    let kubeconfig = c.env.user_kubeconfig(user, &[])?;
    let grant = |name: &str, rules: Value| -> Result<()> {
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules}))?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))?;
        c.block(Api::<ClusterRole>::all(c.client.clone()).create(&PostParams::default(), &role))?;
        c.block(
            Api::<ClusterRoleBinding>::all(c.client.clone())
                .create(&PostParams::default(), &binding),
        )?;
        Ok(())
    };
    grant(
        "bk-core",
        json!([{"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list", "watch"]}]),
    )?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &kubeconfig,
        port,
        &["--service-cidr", "10.96.0.0/16"],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_service_cidrs(&pin, "the flag alone", &strings(&["10.96.0.0/16"]))?;
    wait_addrs(&pin, "pods synced regardless", &addrs(&["10.34.0.5"]))?;
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    // The agent retries (0.5 s, 1 s, 2 s, ...); the warning comes once, and is the only
    // line about them.
    std::thread::sleep(Duration::from_secs(3));
    let warning = ["forbids listing ServiceCIDRs", "deploy/rbac.yaml"];
    ensure!(
        log_lines(&agent, &warning) == 1 && log_lines(&agent, &["servicecidrs"]) == 1,
        "not warned exactly once: {}",
        agent.stderr()
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"forbidden\"}")? == 1.0,
        "not counted once"
    );

    // Granted later: picked up without a restart, at the watcher's next retry.
    grant(
        "bk-servicecidrs",
        json!([{"apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"], "verbs": ["list", "watch"]}]),
    )?;
    wait_for(
        &pin,
        Duration::from_secs(40),
        "ServiceCIDRs once RBAC allows them",
        |s| s.service_cidrs == strings(&["10.0.0.0/24", "10.96.0.0/16"]),
    )?;
    ensure!(
        log_lines(&agent, &["ServiceCIDRs listed"]) == 1,
        "{}",
        agent.stderr()
    );
    Ok(())
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn k8s_deploy_manifests_accepted_by_the_api_server() -> Result<()> {
    // No netns or BPF here, but the same tools and root policy as the others.
    if !preflight("k8s_deploy_manifests_accepted_by_the_api_server")? {
        return Ok(());
    }
    let c = Cluster::start()?;
    let deploy = deploy_dir();
    // uninstall.yaml is applied after `kubectl delete -k`, never with the kustomization.
    let mut files: Vec<String> = std::fs::read_dir(&deploy)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml" && n != "uninstall.yaml")
        .collect();
    files.sort();
    // The kustomization lists every manifest, namespace first.
    let kust: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(deploy.join("kustomization.yaml"))?)?;
    let mut listed: Vec<String> = kust["resources"]
        .as_array()
        .context("kustomization without resources")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    ensure!(
        listed.first().map(String::as_str) == Some("namespace.yaml"),
        "namespace must come first: {listed:?}"
    );
    listed.sort();
    ensure!(
        listed == files,
        "kustomization resources {listed:?} != manifests {files:?}"
    );
    ensure!(deploy.join("Containerfile").is_file(), "no Containerfile");

    // Namespaced objects need their namespace to exist for a dry run.
    c.apply_yaml(&deploy.join("namespace.yaml"), false)?;
    let mut kinds = BTreeSet::new();
    for f in &files {
        for obj in c.apply_yaml(&deploy.join(f), true)? {
            eprintln!("  accepted (dry run): {obj} from {f}");
            kinds.insert(obj.split('/').next().unwrap_or("").to_owned());
        }
    }
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
    ] {
        ensure!(kinds.contains(k), "no {k} in deploy/: {kinds:?}");
    }
    // The uninstall DaemonSet, in its own namespace (stored: a dry run cannot create the
    // namespace its DaemonSet needs; nothing runs it on this API server).
    for obj in c.apply_yaml(&deploy.join("uninstall.yaml"), false)? {
        eprintln!("  accepted: {obj} from uninstall.yaml");
    }
    // A dry run stores nothing.
    let ds: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "bypass-system",
        &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "DaemonSet")),
    );
    ensure!(
        c.block(ds.get_opt("bypass-agent"))?.is_none(),
        "dry run stored the DaemonSet"
    );
    Ok(())
}

/// What a connection published for its peer (a connector, a link) is removed by the
/// sock_ops state callback when it closes, which only runs while sock_ops is attached.
/// Connections that close while the node label has the bypass off leave theirs; the
/// next attach sweeps every entry whose socket is no longer in the SockHash, before
/// sock_ops can insert anything again, so nothing stale stays for a later connection
/// with the same key to find.
#[test]
fn k8s_entries_of_connections_closed_while_off_are_swept() -> Result<()> {
    if !preflight("k8s_entries_of_connections_closed_while_off_are_swept")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod("bk-apps", "a", &node, &[&a4], PodOpts::default())?;
    c.pod("bk-apps", "b", &node, &[&b4], PodOpts::default())?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &[],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "both pods in", &addrs(&[&a4, &b4]))?;
    let pairing = |pin: &Path| -> Result<(u64, u64)> {
        let v = testbed::agent::status_json(pin)?;
        Ok((
            v["connectors"].as_u64().unwrap_or(u64::MAX),
            v["links"].as_u64().unwrap_or(u64::MAX),
        ))
    };
    // Four connections, slow enough to outlive the switch-off.
    let flow = ClientArgs {
        send: 3 << 20,
        recv: 3 << 20,
        streams: 4,
        msg_size: 16 << 10,
        rate: 2 << 20,
        ..ClientArgs::default()
    };
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5120), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5120), &flow)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while pairing(&pin)? != (4, 4) {
        ensure!(
            Instant::now() < deadline,
            "four paired connections expected: {:?}",
            pairing(&pin)?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.label_node(&node, LABEL, Some("false"))?;
    wait_for(&pin, PROPAGATION, "label=false detaches", |s| !s.attached)?;
    let (client, server) = (client.wait()?, server.wait()?);
    ensure!(client.ok && server.ok, "{client:#?} {server:#?}");
    ensure!(
        pairing(&pin)? == (4, 4),
        "closed while detached: the state callback did not run, the entries stay until \
         the next attach: {:?}",
        pairing(&pin)?
    );
    c.label_node(&node, LABEL, Some("true"))?;
    wait_for(&pin, PROPAGATION, "label=true attaches", |s| s.attached)?;
    ensure!(
        pairing(&pin)? == (0, 0),
        "the attach did not sweep the closed connections' entries: {:?}",
        pairing(&pin)?
    );
    ensure!(
        agent.stderr().contains("removed pairing entries"),
        "no log of the sweep: {}",
        agent.stderr()
    );
    Ok(())
}

/// Growth of the counters over `f`, with the wire bytes the pods put on the veths.
fn measured<T>(
    pods: &TwoPods,
    agent: &Agent,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, AgentStatus, AgentStatus, u64)> {
    let before = agent.stats()?;
    let wire0 = pods.wire_bytes()?;
    let out = f()?;
    Ok((out, before, agent.stats()?, pods.wire_bytes()? - wire0))
}

/// Not one byte redirected and no socket inserted between the two readings.
fn ensure_untouched(what: &str, before: &AgentStatus, after: &AgentStatus) -> Result<()> {
    let g = |f: fn(&AgentStatus) -> u64| f(after).saturating_sub(f(before));
    ensure!(
        g(|s| s.counters.redirected_bytes) == 0
            && g(|s| s.counters.sockets_inserted) == 0
            && g(|s| s.counters.paired_loopback) == 0
            && g(|s| s.counters.paired_translated) == 0,
        "{what}: an opted-out pod's bytes were redirected: {before:?} -> {after:?}"
    );
    Ok(())
}

/// Opt-outs judged by traffic, in the ordinary cluster case: the node's podCIDR holds
/// every pod's address. Pod b is annotated `bypass.dev/exclude: "true"`: its bytes take
/// the veths, pod to pod, over loopback inside it, and through a sidecar REDIRECT into
/// it; no socket of its is inserted. Without the annotation the same exchange is
/// bypassed (so the test can tell); with its namespace labelled, not again.
#[test]
fn k8s_opt_outs_hold_by_traffic() -> Result<()> {
    if !preflight("k8s_opt_outs_hold_by_traffic")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &[&pods.pod_cidr_v4(), &pods.pod_cidr_v6()], &[])?;
    c.namespace("bk-apps", &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod("bk-apps", "a", &node, &[&a4], PodOpts::default())?;
    c.pod(
        "bk-apps",
        "b",
        &node,
        &[&b4],
        PodOpts {
            annotations: &[(EXCLUDE, "true")],
            ..PodOpts::default()
        },
    )?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &c.env.kubeconfig(),
        port,
        &[],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pod a in, opted-out b out", &addrs(&[&a4]))?;
    let bulk = ClientArgs::bulk(8 << 20);
    let payload = 2 * (8 << 20);

    // Pod to pod.
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5130),
        pods.b.v4_addr(5130),
        &bulk,
    )?;
    assert_byte_exact(&x, &bulk)?;
    ensure_untouched("pod a -> opted-out pod b", &x.before, &x.after)?;
    ensure!(x.wire >= payload, "the veths carried only {} B", x.wire);
    ensure!(seen(&pin)?.excluded == addrs(&[&b4]), "{:#?}", seen(&pin)?);

    // Loopback inside the opted-out pod (which has just used its pod address).
    let lo = "127.0.0.1:5131".parse()?;
    let ((c1, s1), before, after, _) = measured(&pods, &agent, || {
        let server = PeerServer::start(&pods.b, lo, 1)?;
        let client = run_client(&pods.b, lo, &bulk)?;
        Ok((client, server.wait()?))
    })?;
    ensure!(c1.ok && s1.ok, "loopback: {c1:#?} {s1:#?}");
    ensure_untouched("loopback inside opted-out pod b", &before, &after)?;

    // A sidecar's inbound capture in the opted-out pod: a -> b:5132 is REDIRECTed to a
    // proxy on 15006 in b, which reaches the app on 127.0.0.1:5132.
    iptables::apply(
        pods.b.netns(),
        Family::V4,
        &iptables::sidecar_inbound(5132, 15006),
    )?;
    let proxy = Proxy::start(
        &pods.b,
        &ProxyOpts::new("0.0.0.0:15006".parse()?, "127.0.0.1:5132".parse()?),
    )?;
    let y = exchange(
        &pods,
        &agent,
        "0.0.0.0:5132".parse()?,
        pods.b.v4_addr(5132),
        &bulk,
    )?;
    drop(proxy);
    assert_byte_exact(&y, &bulk)?;
    ensure_untouched("sidecar hops into opted-out pod b", &y.before, &y.after)?;

    // Without the annotation: bypassed, the same exchange.
    c.annotate_pod("bk-apps", "b", EXCLUDE, None)?;
    wait_addrs(&pin, "pod b in", &addrs(&[&a4, &b4]))?;
    let z = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5133),
        pods.b.v4_addr(5133),
        &bulk,
    )?;
    assert_byte_exact(&z, &bulk)?;
    assert_bypassed(&z, &bulk)?;

    // An established connection streaming when the opt-out lands (the namespace label)
    // leaves the bypass too: its link is cut, both sides take TCP, byte-exact.
    let flow = ClientArgs {
        send: 6 << 20,
        recv: 6 << 20,
        msg_size: 16 << 10,
        rate: 3 << 20,
        ..ClientArgs::default()
    };
    let before = agent.stats()?;
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5135), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5135), &flow)?;
    std::thread::sleep(Duration::from_millis(500));
    c.label_namespace("bk-apps", EXCLUDE, Some("true"))?;
    wait_addrs(&pin, "namespace opted out", &BTreeSet::new())?;
    let wire_cut = pods.wire_bytes()?;
    let (client, server) = (client.wait()?, server.wait()?);
    let after = agent.stats()?;
    ensure!(
        client.ok && server.ok && server.bytes_received == 6 << 20,
        "{client:#?} {server:#?}"
    );
    ensure!(
        after.counters.redirected_bytes > before.counters.redirected_bytes
            && after.counters.passed_bytes > before.counters.passed_bytes
            && pods.wire_bytes()? > wire_cut + (1 << 20),
        "the established connection did not leave the bypass when its pod opted out: \
         {before:?} -> {after:?}"
    );
    ensure!(
        agent.stderr().contains("moved to TCP"),
        "no log of the cut: {}",
        agent.stderr()
    );
    let w = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5134),
        pods.b.v4_addr(5134),
        &bulk,
    )?;
    assert_byte_exact(&w, &bulk)?;
    ensure_untouched("namespace opted out", &w.before, &w.after)?;
    ensure!(w.wire >= payload, "the veths carried only {} B", w.wire);
    Ok(())
}
