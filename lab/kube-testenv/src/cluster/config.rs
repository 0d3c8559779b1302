//! Pure: the configuration files of the one-node cluster (containerd, the CNI network,
//! kubelet, kube-proxy) from its [`Layout`], so they are unit-tested.

use std::path::{Path, PathBuf};

use super::cgroups::CgroupLayout;

/// The node's name, as kubelet registers it (the one the tests and the bench label).
pub const NODE_NAME: &str = crate::deploy::NODE;
/// The node's address: on a port-less bridge of our own (this kernel may lack dummy links), so pods (through the bridge) and
/// hostNetwork pods reach the API server through the `kubernetes` Service.
pub const NODE_IP: &str = "10.123.0.1";
/// The node's IPv6 address, beside [`NODE_IP`] (kubelet's `--node-ip` gives both: the
/// node and its pods' `status.hostIPs` are dual-stack; pods and Services stay IPv4).
pub const NODE_IP6: &str = "fd00:123::1";
/// The Pod Security level the API server enforces on every namespace without a label of
/// its own (Talos' default; CIS-hardened distributions enforce as much or more): the
/// agent's chart must label its namespace itself.
pub const POD_SECURITY_DEFAULT: &str = "baseline";
/// The link holding [`NODE_IP`].
pub const NODE_LINK: &str = "bypass-node0";
/// The pods' subnet: the CNI bridge's host-local range (the tests use 10.88/10.96/10.99).
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The Service ClusterIP range.
pub const SERVICE_CIDR: &str = "10.97.0.0/16";
/// The `kubernetes` Service's ClusterIP (the first of [`SERVICE_CIDR`]).
pub const KUBERNETES_SERVICE_IP: &str = "10.97.0.1";
/// The CNI bridge.
pub const BRIDGE: &str = "bypass-cni0";
/// The CNI network's name.
pub const CNI_NETWORK: &str = "bypass-cluster";
/// The API server's port on [`NODE_IP`].
pub const API_PORT: u16 = 6443;
/// The sandbox image containerd runs for every pod (built here, see `image::pause`).
pub const PAUSE_IMAGE: &str = "bypass.local/pause:1";
/// Where the Debian package puts the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Where everything of the cluster lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Persistent state: containerd's root, kubelet's root, etcd, certificates, logs.
    pub var: PathBuf,
    /// Runtime state: containerd's state and socket, pid file.
    pub run: PathBuf,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            var: PathBuf::from("/var/lib/bypass-cluster"),
            run: PathBuf::from("/run/bypass-cluster"),
        }
    }
}

impl Layout {
    /// Certificates and keys.
    pub fn pki(&self) -> PathBuf {
        self.var.join("pki")
    }
    /// Daemon logs.
    pub fn logs(&self) -> PathBuf {
        self.var.join("logs")
    }
    /// containerd's gRPC socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd/containerd.sock")
    }
    /// containerd's config file.
    pub fn containerd_config(&self) -> PathBuf {
        self.var.join("containerd.toml")
    }
    /// The CNI configuration directory.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.var.join("cni/net.d")
    }
    /// kubelet's root directory (pod volumes are mounted below it).
    pub fn kubelet_root(&self) -> PathBuf {
        self.var.join("kubelet")
    }
    /// The admin kubeconfig (what `cluster up` prints).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.var.join("admin.kubeconfig")
    }
    /// `name pid` lines of the daemons `up` started.
    pub fn pids(&self) -> PathBuf {
        self.run.join("pids")
    }
    /// The API server's admission configuration (Pod Security defaults).
    pub fn admission_config(&self) -> PathBuf {
        self.var.join("admission.yaml")
    }
    /// Facts `up` changed on the host and `down` restores (e.g. `ip_forward`).
    pub fn restore(&self) -> PathBuf {
        self.var.join("restore")
    }
}

/// containerd 1.6's configuration (version 2): its own root, state and socket, runc's
/// state under ours, the CRI plugin with runc, our sandbox image and our CNI directory.
/// `restrict_oom`: where this host denies CAP_SYS_RESOURCE (some VMs and containers),
/// no container may get a lower `oom_score_adj` than containerd's own (kubelet asks -998
/// for sandboxes, which runc then fails to set).
pub fn containerd_toml(layout: &Layout, cgroups: CgroupLayout, restrict_oom: bool) -> String {
    let systemd = cgroups.driver() == "systemd";
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
# Plugins this cluster does not use; they only log errors at start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[debug]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd}
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"#,
        root = layout.var.join("containerd").display(),
        state = layout.run.join("containerd/state").display(),
        socket = layout.containerd_socket().display(),
        pause = PAUSE_IMAGE,
        cni_bin = CNI_BIN_DIR,
        cni_conf = layout.cni_conf_dir().display(),
        runc_root = layout.run.join("runc").display(),
    )
}

/// Whether the `CapEff:` line of a `/proc/<pid>/status` text has capability `bit`.
pub fn has_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// CAP_SYS_RESOURCE (linux/capability.h).
pub const CAP_SYS_RESOURCE: u32 = 24;

/// The CNI network: a bridge with host-local addresses from [`POD_CIDR`] (its own IPAM
/// directory), no masquerade (pods talk to the node and to each other only), portmap.
pub fn cni_conflist(layout: &Layout) -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{CNI_NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam}",
        "ranges": [[{{ "subnet": "{POD_CIDR}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}]
      }}
    }},
    {{ "type": "portmap", "capabilities": {{ "portMappings": true }} }}
  ]
}}
"#,
        ipam = layout.var.join("cni/ipam").display(),
    )
}

/// kubelet's configuration file. Ports of its own (`healthz_port`), the API's
/// certificates, the cgroup driver and, on cgroup v1 or hybrid hosts, `failCgroupV1:
/// false` (Kubernetes 1.35 refuses v1 otherwise). Image garbage collection is off: the
/// images are imported, not pulled, and would not come back.
pub fn kubelet_config(layout: &Layout, cgroups: CgroupLayout, healthz_port: u16) -> String {
    let pki = layout.pki();
    let fail_v1 = if cgroups.is_unified() {
        ""
    } else {
        "failCgroupV1: false\n"
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
tlsCertFile: {pki}/kubelet.crt
tlsPrivateKeyFile: {pki}/kubelet.key
cgroupDriver: {driver}
{fail_v1}failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 87600h
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
maxPods: 50
"#,
        ca = pki.join("ca.crt").display(),
        pki = pki.display(),
        driver = cgroups.driver(),
        socket = layout.containerd_socket().display(),
    )
}

/// kube-proxy's configuration: iptables mode, health and metrics on loopback, conntrack
/// sysctls left alone.
pub fn kube_proxy_config(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
clientConnection:
  kubeconfig: {kubeconfig}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
nodePortAddresses: ["{NODE_IP}/32"]
"#,
        kubeconfig = kubeconfig.display(),
    )
}

/// The API server's admission configuration: Pod Security enforces
/// [`POD_SECURITY_DEFAULT`] on every namespace without a level of its own, kube-system
/// exempt, as hardened distributions do.
pub fn admission_config() -> String {
    format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults:
        enforce: {POD_SECURITY_DEFAULT}
        enforce-version: latest
        audit: {POD_SECURITY_DEFAULT}
        audit-version: latest
        warn: {POD_SECURITY_DEFAULT}
        warn-version: latest
      exemptions:
        usernames: []
        runtimeClasses: []
        namespaces: [kube-system]
"#
    )
}

/// kubelet's `--node-ip`: both of the node's addresses, IPv4 first (the primary, what
/// `status.hostIP` says).
pub fn node_ips() -> String {
    format!("{NODE_IP},{NODE_IP6}")
}

/// `https://NODE_IP:API_PORT`.
pub fn api_server_url() -> String {
    format!("https://{NODE_IP}:{API_PORT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_uses_its_own_socket_state_and_cni() {
        let l = Layout::default();
        let t = containerd_toml(&l, CgroupLayout::Hybrid, true);
        assert!(
            t.contains("address = \"/run/bypass-cluster/containerd/containerd.sock\""),
            "{t}"
        );
        assert!(t.contains("root = \"/var/lib/bypass-cluster/containerd\""));
        assert!(t.contains("state = \"/run/bypass-cluster/containerd/state\""));
        assert!(t.contains("conf_dir = \"/var/lib/bypass-cluster/cni/net.d\""));
        assert!(t.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")));
        assert!(t.contains("SystemdCgroup = false"));
        assert!(t.contains("Root = \"/run/bypass-cluster/runc\""));
        assert!(t.contains("restrict_oom_score_adj = true"));
        assert!(
            containerd_toml(&l, CgroupLayout::Unified, false)
                .contains("restrict_oom_score_adj = false")
        );
    }

    #[test]
    fn capabilities_from_status() {
        let without = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        assert!(!has_capability(without, CAP_SYS_RESOURCE));
        assert!(has_capability(without, 21));
        assert!(has_capability(
            "CapEff:\t000001ffffffffff\n",
            CAP_SYS_RESOURCE
        ));
        assert!(!has_capability("", CAP_SYS_RESOURCE));
    }

    #[test]
    fn kubelet_allows_cgroup_v1_only_where_needed() {
        let l = Layout::default();
        let hybrid = kubelet_config(&l, CgroupLayout::Hybrid, 1);
        assert!(hybrid.contains("failCgroupV1: false\n"), "{hybrid}");
        assert!(hybrid.contains("cgroupDriver: cgroupfs\n"));
        let legacy = kubelet_config(&l, CgroupLayout::Legacy, 1);
        assert!(legacy.contains("failCgroupV1: false\n"));
        let unified = kubelet_config(&l, CgroupLayout::Unified, 1);
        assert!(!unified.contains("failCgroupV1"), "{unified}");
        assert!(unified.contains(
            "containerRuntimeEndpoint: unix:///run/bypass-cluster/containerd/containerd.sock\n"
        ));
        assert!(unified.contains("imageGCHighThresholdPercent: 100\n"));
    }

    #[test]
    fn cni_is_a_bridge_with_its_own_ipam_dir() {
        let c = cni_conflist(&Layout::default());
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(
            bridge["ipam"]["dataDir"],
            "/var/lib/bypass-cluster/cni/ipam"
        );
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], POD_CIDR);
        assert_eq!(v["plugins"][1]["type"], "portmap");
        assert!(BRIDGE.len() <= 15 && NODE_LINK.len() <= 15);
    }

    #[test]
    fn kube_proxy_is_iptables_on_loopback() {
        let t = kube_proxy_config(Path::new("/k"), 2, 3);
        assert!(t.contains("mode: iptables\n"));
        assert!(t.contains("healthzBindAddress: 127.0.0.1:2\n"));
        assert!(t.contains("metricsBindAddress: 127.0.0.1:3\n"));
        assert!(t.contains("maxPerCore: 0\n"));
    }

    #[test]
    fn pod_security_enforced_by_default_and_a_dual_stack_node() {
        let a = admission_config();
        assert!(a.contains("enforce: baseline\n"), "{a}");
        assert!(a.contains("namespaces: [kube-system]"));
        assert_eq!(node_ips(), "10.123.0.1,fd00:123::1");
        assert!(NODE_IP6.parse::<std::net::Ipv6Addr>().is_ok());
    }

    #[test]
    fn ranges_stay_out_of_the_tests_ranges() {
        for r in [POD_CIDR, SERVICE_CIDR, NODE_IP] {
            for used in ["10.88.", "10.96.", "10.99."] {
                assert!(!r.starts_with(used), "{r}");
            }
        }
        assert!(KUBERNETES_SERVICE_IP.starts_with("10.97."));
    }
}
