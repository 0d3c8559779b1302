//! The servers of a [`Service`] for one placement, started through `testbed::apps`
//! (each pinned: pod `b`'s to the server CPU, pod `a`'s backends to the client CPU) and
//! kept as guards that stop them on drop.

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use testbed::{
    TwoPods,
    apps::{
        AppServer, Listening, On,
        go::{self, Relay},
        haproxy::{self, Splice},
        iperf, java,
        nginx::Nginx,
        node,
        payload::random_bytes,
        postgres::{self, pgbench_init},
        redis,
    },
};

use super::catalogue::{
    BIG_FILE, BIG_FILE_BYTES, Listener, PGBENCH_SCALE, SMALL_FILE, SMALL_FILE_BYTES, Scale, Service,
};
use crate::model::Placement;

/// A server process of any kind, kept alive.
#[derive(Debug)]
enum Guard {
    Listening(Listening),
    Nginx(Nginx),
}

impl Guard {
    fn server(&mut self) -> &mut AppServer {
        match self {
            Guard::Listening(s) => s.server(),
            Guard::Nginx(s) => s.server(),
        }
    }
}

impl From<Listening> for Guard {
    fn from(s: Listening) -> Self {
        Guard::Listening(s)
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
            Service::Redis => vec![redis::start(b, front)?.into()],
            Service::Nginx => {
                let small = random_bytes(21, SMALL_FILE_BYTES as usize);
                let big = random_bytes(20, scale.amount(BIG_FILE_BYTES) as usize);
                let files: [(&str, &[u8]); 2] = [(SMALL_FILE, &small), (BIG_FILE, &big)];
                vec![Guard::Nginx(Nginx::start(b, front, back_b, &files)?)]
            }
            Service::Postgres => {
                let pg = postgres::start(b, front)?;
                pgbench_init(a, front, PGBENCH_SCALE, scale.client_timeout() * 6)?;
                vec![pg.into()]
            }
            Service::Iperf => vec![iperf::server(b, front)?.into()],
            Service::GoCopyEcho => vec![go::echo(b, front, Relay::Copy)?.into()],
            Service::GoCopyProxy => {
                let sink = go::sink(a, back_a)?;
                let proxy = go::l4proxy(b, front, back_a, Relay::Copy)?;
                vec![proxy.into(), sink.into()]
            }
            Service::GoReverseProxy => {
                let origin = go::http_server(a, back_a)?;
                let proxy = go::reverse_proxy(b, front, back_a)?;
                vec![proxy.into(), origin.into()]
            }
            Service::Grpc => vec![go::grpc_server(b, front)?.into()],
            Service::HaproxySplice | Service::HaproxyNoSplice => {
                let splice = if service == Service::HaproxySplice {
                    Splice::Auto
                } else {
                    Splice::Off
                };
                let echo = go::echo(a, back_a, Relay::ReadWrite)?;
                let proxy = haproxy::start(b, front, back_a, splice)?;
                vec![proxy.into(), echo.into()]
            }
            Service::JavaEcho => vec![java::nio_echo(b, front)?.into()],
            Service::NodeProxy => {
                let echo = node::echo(a, back_a)?;
                let proxy = node::proxy(b, front, back_a)?;
                vec![proxy.into(), echo.into()]
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
