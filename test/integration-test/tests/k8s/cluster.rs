//! A real API server and etcd for one test (the `kube-testenv` crate), and the objects
//! a kubelet and controllers would make on it: nodes, namespaces with their `default`
//! ServiceAccount, pods with their status, ServiceCIDRs, Services and their
//! EndpointSlices, RBAC, and YAML applied server-side.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use base64::{Engine as _, prelude::BASE64_STANDARD};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
    networking::v1::{NetworkPolicy, ServiceCIDR},
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

/// The field manager of server-side applies.
const MANAGER: &str = "bypass-test";

/// A real API server for one test, and an admin client on it.
pub struct Cluster {
    // Dropped last: the runtime and client go before the server.
    rt: tokio::runtime::Runtime,
    pub client: Client,
    pub env: KubeEnv,
}

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

impl Cluster {
    pub fn start() -> Result<Self> {
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

    pub fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A Node with these pod CIDRs and labels.
    pub fn node(&self, name: &str, cidrs: &[&str], labels: &[(&str, &str)]) -> Result<()> {
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
    pub fn label_node(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.block(
            self.nodes()
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .with_context(|| format!("label node {name} {key}={value:?}"))?;
        Ok(())
    }

    /// A namespace with labels, and its `default` ServiceAccount (no controller makes it).
    pub fn namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
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

    pub fn label_namespace(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
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
    pub fn pod(&self, ns: &str, name: &str, node: &str, ips: &[&str], opts: PodOpts) -> Result<()> {
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

    pub fn pod_ips(&self, ns: &str, name: &str, ips: &[&str], phase: &str) -> Result<()> {
        let list: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        let patch = json!({"status": {"phase": phase, "podIP": ips.first(), "podIPs": list}});
        self.block(
            self.pods(ns)
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .with_context(|| format!("set status of pod {ns}/{name}"))?;
        Ok(())
    }

    pub fn annotate_pod(&self, ns: &str, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.block(
            self.pods(ns)
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )?;
        Ok(())
    }

    /// Force delete, as `kubectl delete --grace-period=0 --force`.
    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.block(self.pods(ns).delete(name, &dp))
            .with_context(|| format!("delete pod {ns}/{name}"))?;
        Ok(())
    }

    /// A NetworkPolicy `name` in `ns` selecting every pod there, allowing ingress from
    /// every pod (what it allows does not matter to the bypass: that it changed does).
    pub fn network_policy(&self, ns: &str, name: &str) -> Result<()> {
        let policy: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {}}]}],
            },
        }))?;
        self.block(
            Api::<NetworkPolicy>::namespaced(self.client.clone(), ns)
                .create(&PostParams::default(), &policy),
        )
        .with_context(|| format!("create NetworkPolicy {ns}/{name}"))?;
        Ok(())
    }

    pub fn service_cidrs(&self) -> Api<ServiceCIDR> {
        Api::all(self.client.clone())
    }

    /// A ServiceCIDR, as an administrator adds one (no controller sets it Ready).
    pub fn service_cidr(&self, name: &str, cidrs: &[&str]) -> Result<()> {
        let sc: ServiceCIDR = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"cidrs": cidrs},
        }))?;
        self.block(self.service_cidrs().create(&PostParams::default(), &sc))
            .with_context(|| format!("create servicecidr {name}"))?;
        Ok(())
    }

    pub fn delete_service_cidr(&self, name: &str) -> Result<()> {
        self.block(self.service_cidrs().delete(name, &DeleteParams::default()))
            .with_context(|| format!("delete servicecidr {name}"))?;
        Ok(())
    }

    /// A Service without a selector (no controller runs here to make its EndpointSlices:
    /// [`Cluster::endpoint_slice`] does) with a fixed `cluster_ip` and `ports`.
    pub fn service(&self, ns: &str, name: &str, cluster_ip: &str, ports: Value) -> Result<()> {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"clusterIP": cluster_ip, "ports": ports},
        }))?;
        self.block(
            Api::<Service>::namespaced(self.client.clone(), ns)
                .create(&PostParams::default(), &svc),
        )
        .with_context(|| format!("create service {ns}/{name}"))?;
        Ok(())
    }

    pub fn endpoint_slices(&self, ns: &str) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// An IPv4 EndpointSlice `name` of Service `service`, as the EndpointSlice
    /// controller makes one: one ready endpoint on `node` per address, and `ports`.
    pub fn endpoint_slice(
        &self,
        ns: &str,
        name: &str,
        service: &str,
        node: &str,
        addrs: &[&str],
        ports: Value,
    ) -> Result<()> {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": MANAGER,
            }},
            "addressType": "IPv4",
            "endpoints": endpoints(node, addrs),
            "ports": ports,
        }))?;
        self.block(
            self.endpoint_slices(ns)
                .create(&PostParams::default(), &slice),
        )
        .with_context(|| format!("create endpointslice {ns}/{name}"))?;
        Ok(())
    }

    /// Replaces the endpoints of EndpointSlice `name` with one per address.
    pub fn endpoint_slice_addrs(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        addrs: &[&str],
    ) -> Result<()> {
        let patch = json!({"endpoints": endpoints(node, addrs)});
        self.block(self.endpoint_slices(ns).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(patch),
        ))
        .with_context(|| format!("set the endpoints of endpointslice {ns}/{name}"))?;
        Ok(())
    }

    pub fn delete_endpoint_slice(&self, ns: &str, name: &str) -> Result<()> {
        self.block(
            self.endpoint_slices(ns)
                .delete(name, &DeleteParams::default()),
        )
        .with_context(|| format!("delete endpointslice {ns}/{name}"))?;
        Ok(())
    }

    /// Stores a ServiceCIDR straight into etcd, bypassing validation: what an older API
    /// server with laxer validation could have left (today's refuses host bits).
    pub fn service_cidr_in_etcd(&self, name: &str, cidrs: &[&str]) -> Result<()> {
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
        self.block(etcd_put(
            &etcd_url(&self.env)?,
            &format!("/registry/servicecidrs/{name}"),
            &obj.to_string(),
        ))
    }

    /// A ClusterRole `name` with `rules`, bound to `user`.
    pub fn grant(&self, name: &str, user: &str, rules: Value) -> Result<()> {
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules}))?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))?;
        self.block(
            Api::<ClusterRole>::all(self.client.clone()).create(&PostParams::default(), &role),
        )?;
        self.block(
            Api::<ClusterRoleBinding>::all(self.client.clone())
                .create(&PostParams::default(), &binding),
        )?;
        Ok(())
    }

    /// Server-side applies every object of a YAML file (`dry_run`: validated and
    /// admitted, not stored).
    pub fn apply_yaml(&self, path: &Path, dry_run: bool) -> Result<Vec<String>> {
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

/// How a pod differs from an ordinary one.
#[derive(Default, Clone, Copy)]
pub struct PodOpts<'a> {
    pub host_network: bool,
    pub annotations: &'a [(&'a str, &'a str)],
}

/// EndpointSlice endpoints: one ready one on `node` per address.
fn endpoints(node: &str, addrs: &[&str]) -> Vec<Value> {
    addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}, "nodeName": node}))
        .collect()
}

/// A client with the credentials of `kubeconfig`.
pub async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
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
async fn etcd_put(url: &str, key: &str, value: &str) -> Result<()> {
    let etcd = Client::try_from(kube::Config::new(url.parse()?))
        .with_context(|| format!("a client for etcd at {url}"))?;
    let body = json!({
        "key": BASE64_STANDARD.encode(key),
        "value": BASE64_STANDARD.encode(value),
    });
    let request = http::Request::post("/v3/kv/put")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())?;
    etcd.request_text(request)
        .await
        .with_context(|| format!("etcd put {key}"))?;
    Ok(())
}
