//! Pure: the workloads of the apps scenario. Each drives one [`Service`] (the servers it
//! needs in the pods) with one [`Client`]; the catalogue says with which parameters, at
//! full length and under `--quick`, in which unit its rate comes, and on which ports each
//! service listens for each placement.
//!
//! Every process of pod `a` (the clients, and the backends behind a proxy) runs on the
//! placement's client CPU, every process of pod `b` (the servers and proxies) on its
//! server CPU; the descriptions name each process's pod.

use std::time::Duration;

/// How long the runs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// A measured run.
    Full,
    /// `--quick`: a smoke check, about an eighth of each amount.
    Quick,
}

impl Scale {
    /// `full` bytes, requests or messages at this scale (at least 1).
    pub fn amount(self, full: u64) -> u64 {
        match self {
            Scale::Full => full,
            Scale::Quick => (full / QUICK_DIVISOR).max(1),
        }
    }

    /// [`Scale::amount`] of a `u32`.
    pub fn count(self, full: u32) -> u32 {
        u32::try_from(self.amount(u64::from(full))).unwrap_or(full)
    }

    /// How long a client may run before its run counts as failed: a run that loses
    /// bytes waits for them until then, so it stays short.
    pub fn client_timeout(self) -> Duration {
        match self {
            Scale::Full => Duration::from_secs(10),
            Scale::Quick => Duration::from_secs(6),
        }
    }

    /// `wrk`'s duration (whole seconds: wrk takes no fraction).
    pub fn wrk_duration(self) -> Duration {
        match self {
            Scale::Full => Duration::from_secs(2),
            Scale::Quick => Duration::from_secs(1),
        }
    }
}

/// What `--quick` divides amounts by.
const QUICK_DIVISOR: u64 = 8;

/// The servers one or more workloads drive, in pod `b`, and for the proxies their
/// backend in pod `a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    /// `redis-server` (b).
    Redis,
    /// nginx (b), master and one worker, serving a 16 KiB and a large file.
    Nginx,
    /// PostgreSQL (b), `pgbench -i` scale 1 once started.
    Postgres,
    /// `iperf3 -s` (b).
    Iperf,
    /// The Go echo server by `io.Copy(conn, conn)` (b).
    GoCopyEcho,
    /// The Go L4 proxy by `io.Copy` both ways (b) in front of the Go digest sink (a).
    GoCopyProxy,
    /// The Go `httputil.ReverseProxy` (b) in front of the Go HTTP server (a).
    GoReverseProxy,
    /// The Go gRPC bidirectional-stream echo server (b).
    Grpc,
    /// HAProxy in TCP mode with `option splice-auto` (b) in front of the Go Read/Write
    /// echo (a).
    HaproxySplice,
    /// HAProxy in TCP mode without splicing (b) in front of the Go Read/Write echo (a).
    HaproxyNoSplice,
    /// The Java NIO echo server (b).
    JavaEcho,
    /// The Node.js `stream.pipe` proxy (b) in front of the Node.js pipe echo (a).
    NodeProxy,
}

/// Which of a service's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// What the client connects to (the server, or the proxy), in pod `b`.
    Front,
    /// A proxy's backend in pod `a` (nginx: its HTTPS port, which nothing uses).
    Back,
}

impl Service {
    /// Every service, in the order they start.
    pub const ALL: [Service; 12] = [
        Service::Redis,
        Service::Nginx,
        Service::Postgres,
        Service::Iperf,
        Service::GoCopyEcho,
        Service::GoCopyProxy,
        Service::GoReverseProxy,
        Service::Grpc,
        Service::HaproxySplice,
        Service::HaproxyNoSplice,
        Service::JavaEcho,
        Service::NodeProxy,
    ];

    /// Its front port for placement 0; ten apart, so that the back listener
    /// ([`Service::BACK_OFFSET`] above) and the other placements' fit between.
    fn base(self) -> u16 {
        match self {
            Service::Redis => 6380,
            Service::Nginx => 8080,
            Service::Postgres => 5430,
            Service::Iperf => 5200,
            Service::GoCopyEcho => 7000,
            Service::GoCopyProxy => 7010,
            Service::GoReverseProxy => 7020,
            Service::Grpc => 7030,
            Service::HaproxySplice => 7040,
            Service::HaproxyNoSplice => 7050,
            Service::JavaEcho => 7060,
            Service::NodeProxy => 7070,
        }
    }

    /// How far above the front port the back listener is.
    const BACK_OFFSET: u16 = 5;

    /// The port of `listener` for the placement at `index` (below
    /// [`Service::BACK_OFFSET`]).
    pub fn port(self, listener: Listener, index: usize) -> u16 {
        let back = match listener {
            Listener::Front => 0,
            Listener::Back => Self::BACK_OFFSET,
        };
        self.base() + back + index as u16
    }

    /// How many placements the ports leave room for.
    pub const MAX_PLACEMENTS: usize = Self::BACK_OFFSET as usize;

    /// Whether it keeps idle connections between client runs (the reverse proxy's
    /// upstream pool): restarted at every block, so that no block reuses a connection
    /// set up on another path.
    pub fn fresh_per_block(self) -> bool {
        self == Service::GoReverseProxy
    }

    /// Its processes, each with its pod.
    pub fn servers(self) -> &'static str {
        match self {
            Service::Redis => "redis-server (b)",
            Service::Nginx => "nginx, 1 worker, sendfile on (b)",
            Service::Postgres => "postgres (b)",
            Service::Iperf => "iperf3 -s (b)",
            Service::GoCopyEcho => "Go echo by io.Copy (b)",
            Service::GoCopyProxy => "Go L4 proxy by io.Copy (b) -> Go SHA-256 sink (a)",
            Service::GoReverseProxy => "Go httputil.ReverseProxy (b) -> Go HTTP server (a)",
            Service::Grpc => "Go gRPC echo server (b)",
            Service::HaproxySplice => {
                "haproxy mode tcp, option splice-auto (b) -> Go Read/Write echo (a)"
            }
            Service::HaproxyNoSplice => {
                "haproxy mode tcp, no splicing (b) -> Go Read/Write echo (a)"
            }
            Service::JavaEcho => "Java NIO echo (b)",
            Service::NodeProxy => "Node.js pipe proxy (b) -> Node.js pipe echo (a)",
        }
    }
}

/// What a workload's client does (in pod `a`), full-length amounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// `redis-benchmark -c 8 -t set,get -d 3 -P pipeline`: requests per second over both
    /// tests (requests / the two tests' time).
    RedisBenchmark {
        /// `-P`.
        pipeline: u32,
        /// `-n`, per test.
        requests: u32,
    },
    /// `wrk -t 1 -c 4` on the 16 KiB file: requests per second.
    Wrk,
    /// `ab -c 4` on the 16 KiB file: requests per second.
    Ab {
        /// `-k`; without it a connection per request.
        keep_alive: bool,
        /// `-n`.
        requests: u32,
    },
    /// `curl` of the large file, timed by curl: MB/s.
    Download,
    /// `pgbench -S -c 4 -j 2`: transactions per second.
    Pgbench {
        /// `-C`: a connection per transaction.
        connect_per_transaction: bool,
        /// `-t`, per client.
        transactions: u32,
    },
    /// `iperf3 -c -n bytes`: Gbit/s received.
    Iperf {
        /// `-l`, when not iperf3's 128 KiB.
        write_size: Option<u32>,
        /// `-P`.
        streams: u32,
        /// `-R`: the server sends.
        reverse: bool,
        /// `-n`.
        bytes: u64,
    },
    /// `streamcheck`: connections at once, each sending `bytes` in 64 KiB writes and
    /// checking what comes back (an echo, or the sink's digest): MB/s sent.
    Stream {
        /// Connections.
        connections: u32,
        /// Bytes on each.
        bytes: u64,
    },
    /// `httpcheck` on one keep-alive connection: GET and POST rounds of 1000 B and
    /// 16 KiB bodies, each checked: requests per second.
    HttpRequests {
        /// Rounds (two requests each).
        rounds: u32,
    },
    /// `grpcclient`: one bidirectional stream of 1000 B messages, each echo checked:
    /// messages per second.
    GrpcStream {
        /// Messages.
        messages: u32,
    },
}

/// The files nginx serves.
pub const SMALL_FILE: &str = "small.bin";
/// The small file's size (the apps tests' too).
pub const SMALL_FILE_BYTES: u64 = 16 << 10;
/// The large file.
pub const BIG_FILE: &str = "big.bin";
/// The large file's size at full length.
pub const BIG_FILE_BYTES: u64 = 1 << 30;
/// `pgbench -i` scale.
pub const PGBENCH_SCALE: u32 = 1;
/// `redis-benchmark -c`.
pub const REDIS_CLIENTS: u32 = 8;
/// `redis-benchmark -d`.
pub const REDIS_VALUE_BYTES: u32 = 3;
/// `ab -c` and `wrk -c`.
pub const HTTP_CONCURRENCY: u32 = 4;
/// `pgbench -c`, `-j`.
pub const PGBENCH_CLIENTS: u32 = 4;
/// See [`PGBENCH_CLIENTS`].
pub const PGBENCH_THREADS: u32 = 2;
/// `httpcheck` body sizes.
pub const HTTP_SIZES: [u64; 2] = [1000, 16 << 10];
/// `grpcclient` message size.
pub const GRPC_MESSAGE_BYTES: u64 = 1000;

/// One workload: a client driving a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Its name in tables and on the command line.
    pub name: &'static str,
    /// The servers it drives.
    pub service: Service,
    /// Its client.
    pub client: Client,
}

/// Every workload, in the order of a block: one row each (kept a table by hand).
#[rustfmt::skip]
pub const WORKLOADS: [Workload; 20] = {
    use Client as C;
    const fn w(name: &'static str, service: Service, client: Client) -> Workload {
        Workload { name, service, client }
    }
    // iperf3 -l, -P, -R, -n.
    const fn iperf(write_size: Option<u32>, streams: u32, reverse: bool, bytes: u64) -> Client {
        C::Iperf { write_size, streams, reverse, bytes }
    }
    // streamcheck: connections, bytes on each.
    const fn stream(connections: u32, bytes: u64) -> Client {
        C::Stream { connections, bytes }
    }
    [
        w("redis", Service::Redis, C::RedisBenchmark { pipeline: 1, requests: 50_000 }),
        w("redis-P16", Service::Redis, C::RedisBenchmark { pipeline: 16, requests: 400_000 }),
        w("nginx-wrk", Service::Nginx, C::Wrk),
        w("nginx-ab-k", Service::Nginx, C::Ab { keep_alive: true, requests: 20_000 }),
        w("nginx-ab-close", Service::Nginx, C::Ab { keep_alive: false, requests: 10_000 }),
        w("nginx-download", Service::Nginx, C::Download),
        w("pgbench-S", Service::Postgres, C::Pgbench { connect_per_transaction: false, transactions: 2_500 }),
        w("pgbench-S-C", Service::Postgres, C::Pgbench { connect_per_transaction: true, transactions: 100 }),
        w("iperf3", Service::Iperf, iperf(None, 1, false, 2 << 30)),
        w("iperf3-l64", Service::Iperf, iperf(Some(64), 1, false, 32 << 20)),
        w("iperf3-P4", Service::Iperf, iperf(None, 4, false, 2 << 30)),
        w("iperf3-R", Service::Iperf, iperf(None, 1, true, 2 << 30)),
        w("go-copy-echo", Service::GoCopyEcho, stream(1, 256 << 20)),
        w("go-copy-proxy", Service::GoCopyProxy, stream(8, 32 << 20)),
        w("go-revproxy", Service::GoReverseProxy, C::HttpRequests { rounds: 2_000 }),
        w("grpc-stream", Service::Grpc, C::GrpcStream { messages: 150_000 }),
        w("haproxy-splice", Service::HaproxySplice, stream(4, 64 << 20)),
        w("haproxy-nosplice", Service::HaproxyNoSplice, stream(4, 64 << 20)),
        w("java-nio-echo", Service::JavaEcho, stream(4, 64 << 20)),
        w("node-pipe-proxy", Service::NodeProxy, stream(4, 32 << 20)),
    ]
};

/// The workloads named in `names` (all when empty), in catalogue order; fails naming
/// an unknown one and listing the known.
pub fn select(names: &[String]) -> Result<Vec<Workload>, String> {
    if let Some(bad) = names
        .iter()
        .find(|n| !WORKLOADS.iter().any(|w| w.name == n.as_str()))
    {
        let known: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        return Err(format!(
            "no workload {bad}; the workloads are {}",
            known.join(", ")
        ));
    }
    Ok(WORKLOADS
        .iter()
        .filter(|w| names.is_empty() || names.iter().any(|n| n == w.name))
        .copied()
        .collect())
}

/// The services `workloads` drive, each once, in [`Service::ALL`] order.
pub fn services_of(workloads: &[Workload]) -> Vec<Service> {
    Service::ALL
        .into_iter()
        .filter(|s| workloads.iter().any(|w| w.service == *s))
        .collect()
}

impl Workload {
    /// The unit of its rate.
    pub fn unit(&self) -> &'static str {
        match self.client {
            Client::RedisBenchmark { .. } | Client::Wrk | Client::Ab { .. } => "req/s",
            Client::HttpRequests { .. } => "req/s",
            Client::Download | Client::Stream { .. } => "MB/s",
            Client::Pgbench { .. } => "tx/s",
            Client::Iperf { .. } => "Gbit/s",
            Client::GrpcStream { .. } => "msg/s",
        }
    }

    /// Its client's command at `scale`, and the servers, each with its pod.
    pub fn describe(&self, scale: Scale) -> String {
        let client = match self.client {
            Client::RedisBenchmark { pipeline, requests } => format!(
                "redis-benchmark -c {REDIS_CLIENTS} -n {} -t set,get -d {REDIS_VALUE_BYTES}{} (a)",
                scale.count(requests),
                if pipeline > 1 {
                    format!(" -P {pipeline}")
                } else {
                    String::new()
                }
            ),
            Client::Wrk => format!(
                "wrk -t 1 -c {HTTP_CONCURRENCY} -d {}s, 16 KiB file (a)",
                scale.wrk_duration().as_secs()
            ),
            Client::Ab {
                keep_alive,
                requests,
            } => format!(
                "ab{} -c {HTTP_CONCURRENCY} -n {}, 16 KiB file (a)",
                if keep_alive { " -k" } else { "" },
                scale.count(requests)
            ),
            Client::Download => format!(
                "curl of a {} MiB file, to /dev/null, timed by curl (a)",
                scale.amount(BIG_FILE_BYTES) >> 20
            ),
            Client::Pgbench {
                connect_per_transaction,
                transactions,
            } => format!(
                "pgbench -S{} -c {PGBENCH_CLIENTS} -j {PGBENCH_THREADS} -t {} (a)",
                if connect_per_transaction { " -C" } else { "" },
                scale.count(transactions)
            ),
            Client::Iperf {
                write_size,
                streams,
                reverse,
                bytes,
            } => format!(
                "iperf3 -c -n {} MiB{}{}{} (a)",
                scale.amount(bytes) >> 20,
                write_size.map_or_else(String::new, |l| format!(" -l {l}")),
                if streams > 1 {
                    format!(" -P {streams}")
                } else {
                    String::new()
                },
                if reverse { " -R" } else { "" }
            ),
            Client::Stream { connections, bytes } => format!(
                "streamcheck {connections} x {} MiB, 64 KiB writes, every byte checked (a)",
                scale.amount(bytes) >> 20
            ),
            Client::HttpRequests { rounds } => format!(
                "httpcheck {} GET+POST rounds, 1000 B and 16 KiB bodies, keep-alive (a)",
                scale.count(rounds)
            ),
            Client::GrpcStream { messages } => format!(
                "grpcclient {} x {GRPC_MESSAGE_BYTES} B messages on one stream (a)",
                scale.count(messages)
            ),
        };
        format!("{client} -> {}", self.service.servers())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn names_are_unique_and_every_service_is_driven() {
        let names: BTreeSet<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        assert_eq!(names.len(), WORKLOADS.len());
        assert_eq!(services_of(&WORKLOADS), Service::ALL.to_vec());
    }

    #[test]
    fn ports_are_distinct_and_never_a_skipped_port() {
        let mut seen = BTreeSet::new();
        for s in Service::ALL {
            for i in 0..Service::MAX_PLACEMENTS {
                for l in [Listener::Front, Listener::Back] {
                    let port = s.port(l, i);
                    assert!(seen.insert(port), "{s:?} {l:?} {i}: {port} twice");
                    assert!(
                        !crate::scenario::ISTIO_CONTROL_PORTS.contains(&port),
                        "{port} is a port the agent skips by default"
                    );
                }
            }
        }
    }

    #[test]
    fn select_by_name_in_catalogue_order() {
        let all = select(&[]).unwrap();
        assert_eq!(all.len(), WORKLOADS.len());
        let some = select(&["iperf3".into(), "redis".into()]).unwrap();
        assert_eq!(
            some.iter().map(|w| w.name).collect::<Vec<_>>(),
            ["redis", "iperf3"]
        );
        let err = select(&["nope".into()]).unwrap_err();
        assert!(
            err.contains("no workload nope") && err.contains("redis-P16"),
            "{err}"
        );
        assert_eq!(services_of(&some), [Service::Redis, Service::Iperf]);
    }

    #[test]
    fn quick_is_shorter_and_described() {
        assert_eq!(Scale::Quick.amount(2 << 30), 256 << 20);
        assert_eq!(Scale::Quick.count(4), 1);
        assert!(Scale::Quick.client_timeout() < Scale::Full.client_timeout());
        let w = WORKLOADS.iter().find(|w| w.name == "iperf3-l64").unwrap();
        assert_eq!(
            w.describe(Scale::Quick),
            "iperf3 -c -n 4 MiB -l 64 (a) -> iperf3 -s (b)"
        );
        let r = WORKLOADS.iter().find(|w| w.name == "redis-P16").unwrap();
        assert_eq!(
            r.describe(Scale::Full),
            "redis-benchmark -c 8 -n 400000 -t set,get -d 3 -P 16 (a) -> redis-server (b)"
        );
        assert_eq!(r.unit(), "req/s");
    }
}
