//! The servers of a [`Service`] for one placement, started through `testbed::apps`
//! (each pinned: pod `b`'s to the server CPU, pod `a`'s backends to the client CPU) and
//! kept as guards that stop them on drop.

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use testbed::{
    TwoPods,
    apps::{
        AppServer, On,
        go::{GoServer, Relay},
        haproxy::{Haproxy, Splice},
        iperf::IperfServer,
        java::NioEcho,
        nginx::Nginx,
        node::NodePipe,
        payload::random_bytes,
        postgres::{Postgres, pgbench_init},
        redis::Redis,
    },
};

use super::catalogue::{
    BIG_FILE, BIG_FILE_BYTES, Listener, PGBENCH_SCALE, SMALL_FILE, SMALL_FILE_BYTES, Scale, Service,
};
use crate::model::Placement;

/// A server process of any kind, kept alive.
#[derive(Debug)]
enum Guard {
    Redis(Redis),
    Nginx(Nginx),
    Postgres(Postgres),
    Iperf(IperfServer),
    Go(GoServer),
    Haproxy(Haproxy),
    Java(NioEcho),
    Node(NodePipe),
}

impl Guard {
    fn server(&mut self) -> &mut AppServer {
        match self {
            Guard::Redis(s) => s.server(),
            Guard::Nginx(s) => s.server(),
            Guard::Postgres(s) => s.server(),
            Guard::Iperf(s) => s.server(),
            Guard::Go(s) => s.server(),
            Guard::Haproxy(s) => s.server(),
            Guard::Java(s) => s.server(),
            Guard::Node(s) => s.server(),
        }
    }
}

/// A service's servers, running, for one placement.
#[derive(Debug)]
pub(crate) struct Started {
    /// Which.
    pub(crate) service: Service,
    /// The placement's index.
    pub(crate) placement: usize,
    /// Where its clients connect.
    pub(crate) front: SocketAddr,
    /// The front first: a proxy stops before its backend.
    guards: Vec<Guard>,
}

/// Pod `b` on the server CPU, pod `a` on the client CPU.
fn places<'a>(pods: &'a TwoPods, a_cpu: &'a [usize; 1], b_cpu: &'a [usize; 1]) -> (On<'a>, On<'a>) {
    (
        On {
            pod: &pods.a,
            cpus: a_cpu,
        },
        On {
            pod: &pods.b,
            cpus: b_cpu,
        },
    )
}

impl Started {
    /// Starts `service` for placement `p` (at `index`) at `scale`, ready for clients.
    pub(crate) fn start(
        service: Service,
        pods: &TwoPods,
        index: usize,
        p: &Placement,
        scale: Scale,
    ) -> Result<Self> {
        let (a_cpu, b_cpu) = ([p.client_cpu], [p.server_cpu]);
        let (a, b) = places(pods, &a_cpu, &b_cpu);
        let front = pods.b.v4_addr(service.port(Listener::Front, index));
        let back_b = pods.b.v4_addr(service.port(Listener::Back, index));
        let back_a = pods.a.v4_addr(service.port(Listener::Back, index));
        let guards = match service {
            Service::Redis => vec![Guard::Redis(Redis::start(b, front)?)],
            Service::Nginx => {
                let small = random_bytes(21, SMALL_FILE_BYTES as usize);
                let big = random_bytes(20, scale.amount(BIG_FILE_BYTES) as usize);
                let files: [(&str, &[u8]); 2] = [(SMALL_FILE, &small), (BIG_FILE, &big)];
                vec![Guard::Nginx(Nginx::start(b, front, back_b, &files)?)]
            }
            Service::Postgres => {
                let pg = Postgres::start(b, front)?;
                pgbench_init(a, front, PGBENCH_SCALE, scale.client_timeout() * 6)?;
                vec![Guard::Postgres(pg)]
            }
            Service::Iperf => vec![Guard::Iperf(IperfServer::start(b, front)?)],
            Service::GoCopyEcho => vec![Guard::Go(GoServer::echo(b, front, Relay::Copy)?)],
            Service::GoCopyProxy => {
                let sink = GoServer::sink(a, back_a)?;
                let proxy = GoServer::l4proxy(b, front, back_a, Relay::Copy)?;
                vec![Guard::Go(proxy), Guard::Go(sink)]
            }
            Service::GoReverseProxy => {
                let origin = GoServer::http(a, back_a)?;
                let proxy = GoServer::reverse_proxy(b, front, back_a)?;
                vec![Guard::Go(proxy), Guard::Go(origin)]
            }
            Service::Grpc => vec![Guard::Go(GoServer::grpc(b, front)?)],
            Service::HaproxySplice | Service::HaproxyNoSplice => {
                let splice = if service == Service::HaproxySplice {
                    Splice::Auto
                } else {
                    Splice::Off
                };
                let echo = GoServer::echo(a, back_a, Relay::ReadWrite)?;
                let proxy = Haproxy::start(b, front, back_a, splice)?;
                vec![Guard::Haproxy(proxy), Guard::Go(echo)]
            }
            Service::JavaEcho => vec![Guard::Java(NioEcho::start(b, front)?)],
            Service::NodeProxy => {
                let echo = NodePipe::echo(a, back_a)?;
                let proxy = NodePipe::proxy(b, front, back_a)?;
                vec![Guard::Node(proxy), Guard::Node(echo)]
            }
        };
        Ok(Self {
            service,
            placement: index,
            front,
            guards,
        })
    }

    /// Fails, with the server's log, if one of its processes has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<()> {
        for g in &mut self.guards {
            g.server()
                .ensure_running()
                .with_context(|| format!("{:?}", self.service))?;
        }
        Ok(())
    }

    /// `http://FRONT/name` (nginx).
    pub(crate) fn url(&self, name: &str) -> String {
        format!("http://{}/{name}", self.front)
    }
}
