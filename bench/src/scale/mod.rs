//! `bypass-bench scale` (`cargo xtask bench --scenario scale`): one agent against a real
//! API server (kube-testenv's `KubeEnv`: etcd and kube-apiserver, no kubelet) holding a
//! large cluster's objects, which the bench creates through the API ([`objects`]): Nodes,
//! Pods with addresses (one node the agent's), Services with their EndpointSlices,
//! NetworkPolicies. The agent runs as the chart runs it (Kubernetes mode, its node's
//! name, here an admin kubeconfig), privileged on this host with its own pin directory
//! and an empty cgroup of its own. Then an idle window and a churn window (pod, endpoint
//! and policy updates at a fixed rate); in both, a latency probe changes the address of
//! one of the agent's node's pods once a second and times the new address's arrival in
//! the agent's pod address map. Measured: the agent's CPU (`/proc/<pid>/stat`), peak
//! RSS, reconcile passes per second (`bypass_reconciles`), the probe's latency, and the
//! watches and list/watch requests the API server counts while the agent is the only
//! client watching (`apiserver_longrunning_requests`, `apiserver_request_total`).

pub mod objects;
pub mod promtext;

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use bypass_common::{IpKey, ip_key, names};
use futures::StreamExt as _;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
    networking::v1::{NetworkPolicy, ServiceCIDR},
};
use kube::{
    Client,
    api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_testenv::KubeEnv;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use testbed::{
    agent::{Agent, AgentOpts},
    cgroup::CgroupGuard,
};

use self::objects::{Counts, PodRef};
use crate::{driver::write_files, env, procfs, stats};

/// Where the results go by default.
pub const DEFAULT_OUT: &str = "results/scale/latest";

/// What to run (`bypass-bench scale`'s options).
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The cluster's size.
    #[command(flatten)]
    pub counts: Counts,
    /// Updates a second in the churn window.
    #[arg(long, default_value_t = 300)]
    pub churn_rate: u32,
    /// Seconds of churn.
    #[arg(long, default_value_t = 90)]
    pub churn_secs: u32,
    /// Seconds of the idle window before it (no churn).
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u32,
    /// Requests in flight while creating and churning (at least 1).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub concurrency: usize,
    /// The API server's and etcd's state (removed at the end).
    #[arg(long, default_value = "/dev/shm/bypass-scale")]
    pub state_dir: PathBuf,
    /// One more argument for `bypass-agent run` (repeat it).
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// What the run is called in its table (e.g. `before`, `after`).
    #[arg(long, default_value = "latest")]
    pub label: String,
}

/// A count given on the command line, 0 taken as 1.
fn at_least_one(s: &str) -> Result<usize, std::num::ParseIntError> {
    s.parse::<usize>().map(|n| n.max(1))
}

/// How long creating a kind of object took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Created {
    /// The kind.
    pub kind: String,
    /// How many.
    pub count: u32,
    /// Seconds.
    pub secs: f64,
}

/// One window's measurements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Window {
    /// Seconds.
    pub secs: f64,
    /// Updates sent per second (achieved), and how many failed.
    pub updates_per_sec: f64,
    /// Failed updates.
    pub update_errors: u64,
    /// The agent's CPU, percent of one core.
    pub cpu_percent: f64,
    /// Reconcile passes a second.
    pub passes_per_sec: f64,
    /// Mean seconds a pass took (`bypass_reconcile_seconds`, where the agent has it).
    pub pass_mean_ms: Option<f64>,
    /// Probe latencies, ms: from sending the pod's new address to the API server to its
    /// arrival in the pod address map.
    pub probe_ms: Vec<f64>,
    /// The probe writes' own latencies (the API server's answer), ms.
    pub probe_write_ms: Vec<f64>,
    /// Probes that timed out.
    pub probe_timeouts: u32,
    /// Watch events the API server sent a second, by kind.
    pub watch_events_per_sec: BTreeMap<String, f64>,
}

/// The run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    /// `before`, `after`, ...
    pub label: String,
    /// The cluster.
    pub counts: Counts,
    /// The churn's rate, updates a second.
    pub churn_rate: u32,
    /// The agent's arguments beyond the bench's own.
    pub agent_args: Vec<String>,
    /// The machine: CPUs, memory, kernel.
    pub machine: String,
    /// Creating the objects.
    pub created: Vec<Created>,
    /// From the agent's start to its map holding its node's pods, s.
    pub first_sync_secs: f64,
    /// From the agent's start to its Service backends coming from the API, s.
    pub backends_secs: f64,
    /// Watches the agent holds open, by resource (`apiserver_longrunning_requests`).
    pub watches: BTreeMap<String, f64>,
    /// LIST and WATCH requests the agent made over its life, by resource.
    pub list_watch_requests: BTreeMap<String, f64>,
    /// Idle window.
    pub idle: Window,
    /// Churn window.
    pub churn: Window,
    /// Peak resident memory, KiB (VmHWM).
    pub rss_peak_kib: u64,
    /// Resident memory at the end, KiB.
    pub rss_end_kib: u64,
}

/// Runs the bench (root: the agent loads its datapath).
pub fn run(opts: &Options) -> Result<Results> {
    let problems = opts.counts.problems();
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    ensure!(
        nix::unistd::Uid::effective().is_root(),
        "the scale bench runs the agent, which loads its datapath: run it as root"
    );
    let env = KubeEnv::start(&opts.state_dir).with_context(|| {
        format!(
            "start the API server and etcd under {}",
            opts.state_dir.display()
        )
    })?;
    eprintln!("scale: API server at {}", env.server());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = rt.block_on(client(&env.kubeconfig()))?;
    let created = rt.block_on(create_all(&client, opts))?;
    let api_before = env.get("/metrics")?.1;
    let agent = Running::start(&env, opts)?;
    let (first_sync_secs, backends_secs) = agent.synced(opts)?;
    let probe_counter = AtomicU64::new(0);
    let ctx = Ctx {
        client: &client,
        opts,
        map: &agent.map,
        pid: agent.agent.pid(),
        metrics: agent.metrics,
        env: &env,
        probes: &probe_counter,
    };
    eprintln!("scale: idle window, {} s", opts.idle_secs);
    let idle = rt.block_on(window(&ctx, opts.idle_secs, 0))?;
    eprintln!(
        "scale: churn window, {} s at {} updates/s",
        opts.churn_secs, opts.churn_rate
    );
    let churn = rt.block_on(window(&ctx, opts.churn_secs, opts.churn_rate))?;
    let (watches, list_watch_requests) = api_requests(&api_before, &env.get("/metrics")?.1);
    let end = procfs::snapshot(agent.agent.pid())?;
    drop(agent);
    Ok(Results {
        label: opts.label.clone(),
        counts: opts.counts,
        churn_rate: opts.churn_rate,
        agent_args: opts.agent_args.clone(),
        machine: machine(),
        created,
        first_sync_secs,
        backends_secs,
        watches,
        list_watch_requests,
        idle,
        churn,
        rss_peak_kib: end.hwm_kib,
        rss_end_kib: end.rss_kib,
    })
}

/// The agent as the chart runs it (Kubernetes mode, its node's name), in a cgroup of
/// its own (nothing in it: attaching moves no traffic), with its pod address map and
/// its metrics address.
struct Running {
    // Drop order: the agent, then its cgroup.
    agent: Agent,
    _cgroup: CgroupGuard,
    map: BpfHashMap<MapData, IpKey, u8>,
    metrics: SocketAddr,
    started: Instant,
}

impl Running {
    /// Starts the agent against the API server of `env`.
    fn start(env: &KubeEnv, opts: &Options) -> Result<Self> {
        let cgroup = CgroupGuard::create("bb-scale")?;
        let pin_dir = PathBuf::from("/sys/fs/bpf/bb-scale");
        testbed::agent::remove_pins(&pin_dir)?;
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let mut extra = vec![
            "--node-name".to_owned(),
            objects::node_name(0),
            "--kubeconfig".to_owned(),
            env.kubeconfig().display().to_string(),
            "--metrics-addr".to_owned(),
            metrics.to_string(),
        ];
        extra.extend(opts.agent_args.iter().cloned());
        let agent_opts = AgentOpts {
            pod_cidrs: Vec::new(),
            pod_ips: Vec::new(),
            cgroup: cgroup.path().to_path_buf(),
            pin_dir: pin_dir.clone(),
            extra_args: extra,
            env: Vec::new(),
            allow_unguarded: true,
            binary: None,
        };
        let started = Instant::now();
        let agent = Agent::start(&agent_opts)?;
        Ok(Self {
            agent,
            _cgroup: cgroup,
            map: pod_addrs(&pin_dir)?,
            metrics,
            started,
        })
    }

    /// Waits for the agent's first sync: seconds from its start to its map holding its
    /// node's pods, and to its Service backends coming from the API.
    fn synced(&self, opts: &Options) -> Result<(f64, f64)> {
        let own: Vec<Ipv4Addr> = opts
            .counts
            .pods()
            .filter(|p| p.node == 0)
            .map(|p| p.ip())
            .collect();
        wait_until(
            "the agent's pod address map to hold its node's pods",
            || Ok(own.iter().all(|ip| contains(&self.map, *ip))),
        )?;
        let first_sync_secs = self.started.elapsed().as_secs_f64();
        wait_until("the agent's Service backends to come from the API", || {
            Ok(!self.agent.stats()?.service_backends.is_empty())
        })?;
        let backends_secs = self.started.elapsed().as_secs_f64();
        eprintln!(
            "scale: agent synced in {first_sync_secs:.1} s, Service backends in {backends_secs:.1} s"
        );
        Ok((first_sync_secs, backends_secs))
    }
}

/// From the API server's `/metrics` `before` and `after` the windows: the watches the
/// agent holds, by resource, and the LIST and WATCH requests it made, by verb and
/// resource (pure).
fn api_requests(before: &str, after: &str) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let watch = |text: &str| {
        promtext::sum_by(
            text,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
            "resource",
        )
    };
    let requests = |text: &str, verb: &str| {
        promtext::sum_by(
            text,
            "apiserver_request_total",
            &[("verb", verb)],
            "resource",
        )
    };
    let watches = promtext::delta(&watch(before), &watch(after));
    let mut list_watch_requests = BTreeMap::new();
    for verb in ["LIST", "WATCH"] {
        for (r, n) in promtext::delta(&requests(before, verb), &requests(after, verb)) {
            list_watch_requests.insert(format!("{verb} {r}"), n);
        }
    }
    (watches, list_watch_requests)
}

/// What a window needs.
struct Ctx<'a> {
    client: &'a Client,
    opts: &'a Options,
    map: &'a BpfHashMap<MapData, IpKey, u8>,
    pid: u32,
    metrics: SocketAddr,
    env: &'a KubeEnv,
    /// Probes so far (each probe's address is its own).
    probes: &'a AtomicU64,
}

/// One window of `secs` with `rate` updates a second (0: idle) and a probe a second.
async fn window(ctx: &Ctx<'_>, secs: u32, rate: u32) -> Result<Window> {
    let agent_before = agent_metrics(ctx.metrics).await?;
    let api_before = api_metrics(ctx.env)?;
    let cpu_before = procfs::snapshot(ctx.pid)?;
    let start = Instant::now();
    let length = Duration::from_secs(u64::from(secs));
    let sent = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let churn = churn(ctx, rate, start, start + length, &sent, &failed);
    let probes = probes(ctx, start + length);
    let ((), probes) = tokio::join!(churn, probes);
    let probes = probes?;
    let secs = start.elapsed().as_secs_f64();
    let cpu_after = procfs::snapshot(ctx.pid)?;
    let agent_after = agent_metrics(ctx.metrics).await?;
    let api_after = api_metrics(ctx.env)?;
    let passes = promtext::total(&agent_after, "bypass_reconciles_total", &[])
        - promtext::total(&agent_before, "bypass_reconciles_total", &[]);
    let pass_mean_ms = {
        let sum = promtext::total(&agent_after, "bypass_reconcile_seconds_sum", &[])
            - promtext::total(&agent_before, "bypass_reconcile_seconds_sum", &[]);
        let count = promtext::total(&agent_after, "bypass_reconcile_seconds_count", &[])
            - promtext::total(&agent_before, "bypass_reconcile_seconds_count", &[]);
        (count > 0.0).then(|| sum / count * 1000.0)
    };
    let events = |t: &str| promtext::sum_by(t, "apiserver_watch_events_total", &[], "resource");
    let watch_events_per_sec = promtext::delta(&events(&api_before), &events(&api_after))
        .into_iter()
        .map(|(k, n)| (k, n / secs))
        .collect();
    Ok(Window {
        secs,
        updates_per_sec: sent.load(Ordering::Relaxed) as f64 / secs,
        update_errors: failed.load(Ordering::Relaxed),
        cpu_percent: (cpu_after.cpu_ms - cpu_before.cpu_ms) / (secs * 1000.0) * 100.0,
        passes_per_sec: passes / secs,
        pass_mean_ms,
        probe_ms: probes.iter().filter_map(|p| p.0).collect(),
        probe_write_ms: probes.iter().map(|p| p.1).collect(),
        probe_timeouts: u32::try_from(probes.iter().filter(|p| p.0.is_none()).count())
            .unwrap_or(u32::MAX),
        watch_events_per_sec,
    })
}

/// The API server's `/metrics` text, from within the runtime (its client blocks).
fn api_metrics(env: &KubeEnv) -> Result<String> {
    let (code, body) = tokio::task::block_in_place(|| env.get("/metrics"))?;
    ensure!(code == 200, "the API server's /metrics answered {code}");
    Ok(body)
}

/// The agent's `/metrics` text.
async fn agent_metrics(addr: SocketAddr) -> Result<String> {
    let (code, body) =
        tokio::task::spawn_blocking(move || testbed::agent::http_get_at(addr, "/metrics"))
            .await??;
    ensure!(code == 200, "the agent's /metrics answered {code}");
    Ok(body)
}

/// How long a probe waits for its address before it counts as timed out: a net.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// A probe a second until `until`: (latency ms, or `None` past [`PROBE_TIMEOUT`]; the
/// write's own latency ms).
async fn probes(ctx: &Ctx<'_>, until: Instant) -> Result<Vec<(Option<f64>, f64)>> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= until {
            return Ok(out);
        }
        let k = ctx.probes.fetch_add(1, Ordering::Relaxed);
        let k = u32::try_from(k).unwrap_or(u32::MAX);
        let pod = PodRef {
            node: 0,
            index: k % ctx.opts.counts.node_pods,
        };
        let ip = objects::probe_ip(k);
        let api = api::<Pod>(ctx.client, Some(&pod.namespace(ctx.opts.counts.namespaces)));
        let start = Instant::now();
        api.patch_status(
            &pod.name(),
            &PatchParams::default(),
            &Patch::Merge(objects::pod_status_patch(ip)),
        )
        .await
        .with_context(|| format!("probe: write pod {}'s address", pod.name()))?;
        let write = start.elapsed();
        let seen = loop {
            if contains(ctx.map, ip) {
                break Some(start.elapsed());
            }
            if start.elapsed() > PROBE_TIMEOUT {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        out.push((
            seen.map(|d| d.as_secs_f64() * 1000.0),
            write.as_secs_f64() * 1000.0,
        ));
    }
}

/// `rate` updates a second until `until`, in ticks of 10 ms: half pod updates on other
/// nodes (an annotation), four in ten EndpointSlice updates (their endpoints move), one
/// in ten NetworkPolicy edits (the port it allows).
async fn churn(
    ctx: &Ctx<'_>,
    rate: u32,
    start: Instant,
    until: Instant,
    sent: &AtomicU64,
    failed: &AtomicU64,
) {
    if rate == 0 {
        tokio::time::sleep_until(until.into()).await;
        return;
    }
    let c = ctx.opts.counts;
    let updates = futures::stream::unfold(0u64, move |n| async move {
        // Update n is due at start + n / rate.
        let due = start + Duration::from_secs_f64(n as f64 / f64::from(rate));
        if due >= until {
            return None;
        }
        tokio::time::sleep_until(due.into()).await;
        Some((n, n + 1))
    });
    updates
        .map(|n| async move {
            let r = update(ctx.client, &c, n).await;
            sent.fetch_add(1, Ordering::Relaxed);
            if r.is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        })
        .buffer_unordered(ctx.opts.concurrency)
        .collect::<()>()
        .await;
}

/// Churn update `n`.
async fn update(client: &Client, c: &Counts, n: u64) -> Result<()> {
    let generation = u32::try_from(n / 10).unwrap_or(u32::MAX);
    let pick = u32::try_from(n.wrapping_mul(2_654_435_761) % u64::from(u32::MAX)).unwrap_or(0);
    match n % 10 {
        0..=4 => {
            // A pod of another node.
            let Some(p) = c.other_pod(pick) else {
                return Ok(());
            };
            api::<Pod>(client, Some(&p.namespace(c.namespaces)))
                .patch(
                    &p.name(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "annotations": { "scale/generation": generation.to_string() } } })),
                )
                .await?;
        }
        5..=8 => {
            let k = pick % c.services;
            let (name, ns) = objects::service_ref(k, c.namespaces);
            let slice = objects::endpoint_slice_json(c, k, generation);
            api::<EndpointSlice>(client, Some(&ns))
                .patch(
                    &format!("{name}-s"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "endpoints": slice["endpoints"] })),
                )
                .await?;
        }
        _ => {
            let k = pick % c.policies.max(1);
            let (name, ns) = objects::policy_ref(k, c.namespaces);
            let policy = objects::policy_json(k, c.namespaces, generation);
            api::<NetworkPolicy>(client, Some(&ns))
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": policy["spec"] })),
                )
                .await?;
        }
    }
    Ok(())
}

/// An API of kind `K` (namespaced when `ns` is given) over dynamic objects, so one
/// helper creates and patches every kind.
fn api<K>(client: &Client, ns: Option<&str>) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    let ar = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// A client of the API server from `kubeconfig`.
async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("kubeconfig")?;
    Ok(Client::try_from(config)?)
}

/// Creates `obj` of kind `K`, retrying a failure (an overloaded API server) a few times;
/// an object that exists already is fine.
async fn create<K>(client: &Client, obj: Value) -> Result<()>
where
    K: kube::Resource<DynamicType = ()>,
{
    let obj: DynamicObject = serde_json::from_value(obj)?;
    let api = api::<K>(client, obj.metadata.namespace.as_deref());
    retried(|| async {
        match api.create(&PostParams::default(), &obj).await {
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            r => r.map(|_| ()),
        }
    })
    .await
    .with_context(|| format!("create {:?}", obj.metadata.name))
}

/// `f` until it succeeds, at most five times, backing off; an answer that says the
/// request is wrong (4xx other than 429) is not retried.
async fn retried<F, Fut>(f: F) -> Result<(), kube::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let mut delay = Duration::from_millis(100);
    for _ in 0..4 {
        match f().await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                return Err(kube::Error::Api(s));
            }
            Err(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    f().await
}

/// Creates `objects` of kind `K`, `concurrency` at a time, with `then` (a status write)
/// after each; logs progress.
async fn create_many<K>(
    client: &Client,
    what: &str,
    concurrency: usize,
    objects: impl Iterator<Item = (Value, Option<Value>)>,
) -> Result<Created>
where
    K: kube::Resource<DynamicType = ()>,
{
    let start = Instant::now();
    let done = AtomicU64::new(0);
    let results: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|(obj, status)| {
            let done = &done;
            async move {
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
                create::<K>(client, obj).await?;
                if let Some(status) = status {
                    let api = api::<K>(client, ns.as_deref());
                    retried(|| async {
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .map(|_| ())
                    })
                    .await
                    .with_context(|| format!("write {name}'s status"))?;
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(10_000) {
                    eprintln!(
                        "scale: {n} {what} ({:.0}/s)",
                        n as f64 / start.elapsed().as_secs_f64()
                    );
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let count = results.len();
    if let Some(e) = results.into_iter().find_map(Result::err) {
        return Err(e);
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "scale: created {count} {what} in {secs:.1} s ({:.0}/s)",
        count as f64 / secs
    );
    Ok(Created {
        kind: what.to_owned(),
        count: u32::try_from(count).unwrap_or(u32::MAX),
        secs,
    })
}

/// Creates the whole cluster, kind by kind.
async fn create_all(client: &Client, opts: &Options) -> Result<Vec<Created>> {
    let (c, n) = (opts.counts, opts.concurrency);
    create::<ServiceCIDR>(client, objects::service_cidr_json()).await?;
    let ns = c.namespaces;
    Ok(vec![
        create_many::<Namespace>(
            client,
            "namespaces",
            n,
            plain(0..ns, objects::namespace_json),
        )
        .await?,
        // Pods need their namespace's default ServiceAccount (no controller manager runs
        // to make it).
        create_many::<ServiceAccount>(
            client,
            "serviceaccounts",
            n,
            plain(0..ns, objects::service_account_json),
        )
        .await?,
        create_many::<Node>(client, "nodes", n, plain(0..c.nodes, objects::node_json)).await?,
        create_many::<Pod>(
            client,
            "pods",
            n,
            c.pods().map(|p| {
                let status = objects::pod_status_patch(p.ip());
                (objects::pod_json(p, ns), Some(status))
            }),
        )
        .await?,
        create_many::<Service>(
            client,
            "services",
            n,
            plain(0..c.services, |k| objects::service_json(k, ns)),
        )
        .await?,
        create_many::<EndpointSlice>(
            client,
            "endpointslices",
            n,
            plain(0..c.services, |k| objects::endpoint_slice_json(&c, k, 0)),
        )
        .await?,
        create_many::<NetworkPolicy>(
            client,
            "networkpolicies",
            n,
            plain(0..c.policies, |k| objects::policy_json(k, ns, 0)),
        )
        .await?,
    ])
}

/// Objects `0..n` of `json`, with no status to write after.
fn plain(
    range: std::ops::Range<u32>,
    json: impl Fn(u32) -> Value,
) -> impl Iterator<Item = (Value, Option<Value>)> {
    range.map(move |i| (json(i), None))
}

/// The agent's pod address map, from its pin.
fn pod_addrs(pin_dir: &Path) -> Result<BpfHashMap<MapData, IpKey, u8>> {
    let path = pin_dir
        .join(names::PIN_MAPS_SUBDIR)
        .join(names::MAP_POD_ADDRS);
    let data = MapData::from_pin(&path).with_context(|| format!("open {}", path.display()))?;
    let map = Map::from_map_data(data).with_context(|| format!("open {}", path.display()))?;
    BpfHashMap::try_from(map).with_context(|| format!("{} as a hash map", path.display()))
}

fn contains(map: &BpfHashMap<MapData, IpKey, u8>, ip: Ipv4Addr) -> bool {
    map.get(&ip_key(IpAddr::V4(ip)), 0).is_ok()
}

/// Polls `done` every 50 ms until it holds, at most ten minutes (a net: the first list
/// of a large cluster takes a while on a busy machine).
fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("waited ten minutes for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// CPUs, memory and kernel of this machine.
fn machine() -> String {
    format!(
        "{} CPUs, {:.0} GiB, Linux {}",
        env::cpus(),
        env::mem_total_kib() as f64 / 1024.0 / 1024.0,
        env::kernel()
    )
}

/// Median, p90, p99 and max of `v`, ms.
fn quantiles(v: &[f64]) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let q =
        |p| stats::percentile_sorted(&s, p).map_or_else(|| "-".to_owned(), |x| format!("{x:.0}"));
    format!("{} / {} / {} / {}", q(50.0), q(90.0), q(99.0), q(100.0))
}

/// The Markdown table of `r` (pure).
pub fn render(r: &Results) -> String {
    let c = r.counts;
    let mut out = format!(
        "## {label}\n\nCluster: {nodes} Nodes, {pods} Pods ({np} on the agent's node), {ns} namespaces, {svc} Services with one EndpointSlice each, {pol} NetworkPolicies. Machine: {machine}. Agent arguments: {args:?}.\n\n",
        label = r.label,
        nodes = c.nodes,
        pods = c.pods,
        np = c.node_pods,
        ns = c.namespaces,
        svc = c.services,
        pol = c.policies,
        machine = r.machine,
        args = r.agent_args,
    );
    out.push_str("| window | updates/s | agent CPU (% of a core) | passes/s | mean pass (ms) | probe latency ms (p50 / p90 / p99 / max) | probe write ms (p50 / p90 / p99 / max) | probes (timed out) |\n|---|---|---|---|---|---|---|---|\n");
    for (name, w) in [("idle", &r.idle), ("churn", &r.churn)] {
        out.push_str(&format!(
            "| {name} | {:.0} ({} failed) | {:.1} | {:.1} | {} | {} | {} | {} ({}) |\n",
            w.updates_per_sec,
            w.update_errors,
            w.cpu_percent,
            w.passes_per_sec,
            w.pass_mean_ms
                .map_or_else(|| "-".to_owned(), |m| format!("{m:.1}")),
            quantiles(&w.probe_ms),
            quantiles(&w.probe_write_ms),
            w.probe_ms.len(),
            w.probe_timeouts,
        ));
    }
    out.push_str(&format!(
        "\nMemory: peak RSS {:.1} MiB, at the end {:.1} MiB. First sync (its node's pods in the map) {:.1} s after start, Service backends {:.1} s.\n\n",
        r.rss_peak_kib as f64 / 1024.0,
        r.rss_end_kib as f64 / 1024.0,
        r.first_sync_secs,
        r.backends_secs
    ));
    out.push_str(
        "Watches the agent holds (API server, `apiserver_longrunning_requests{verb=\"WATCH\"}`): ",
    );
    out.push_str(&join(&r.watches));
    out.push_str(".\n\nLIST and WATCH requests over its life (`apiserver_request_total`; a watch counts once it ends): ");
    out.push_str(&join(&r.list_watch_requests));
    out.push_str(".\n\nWatch events the API server sent a second in the churn window (`apiserver_watch_events_total`): ");
    out.push_str(&join(&r.churn.watch_events_per_sec));
    out.push_str(".\n\nCreation: ");
    let created: Vec<String> = r
        .created
        .iter()
        .map(|c| format!("{} {} in {:.0} s", c.count, c.kind, c.secs))
        .collect();
    out.push_str(&created.join(", "));
    out.push_str(".\n");
    out
}

fn join(m: &BTreeMap<String, f64>) -> String {
    let v: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n:.1}")).collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

/// Writes `scale.json` and `scale.md` under `out`; returns the paths.
pub fn write_outputs(r: &Results, out: &Path) -> Result<Vec<PathBuf>> {
    write_files(
        out,
        &[
            ("scale.json", serde_json::to_string_pretty(r)?),
            ("scale.md", render(r)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_watches_and_requests_are_what_grew() {
        let before = r#"apiserver_request_total{verb="LIST",resource="pods",code="200"} 1"#;
        let after = [
            r#"apiserver_longrunning_requests{verb="WATCH",resource="pods",scope="cluster"} 2"#,
            r#"apiserver_longrunning_requests{verb="GET",resource="pods",scope="cluster"} 5"#,
            r#"apiserver_request_total{verb="LIST",resource="pods",code="200"} 4"#,
            r#"apiserver_request_total{verb="WATCH",resource="nodes",code="200"} 1"#,
        ]
        .join("\n");
        let (watches, requests) = api_requests(before, &after);
        assert_eq!(watches, BTreeMap::from([("pods".to_owned(), 2.0)]));
        assert_eq!(
            requests,
            BTreeMap::from([
                ("LIST pods".to_owned(), 3.0),
                ("WATCH nodes".to_owned(), 1.0)
            ])
        );
    }
}
