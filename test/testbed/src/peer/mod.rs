//! The peer TCP tool as a library: a client and a server that move a deterministic
//! pattern each way and verify every byte in order, or ping-pong small messages and time
//! them. The test tool's `peer` subcommand (`src/bin/bypass-test-tool/peer.rs`) only
//! parses options; [`crate::pod_peers`] runs it inside pods and parses its [`Report`].

pub mod cli;
pub mod client;
mod io;
pub mod pattern;
pub mod report;
pub mod server;
pub mod wire;

pub use io::PatientReader;
pub use report::{Failure, Report, Rtt};

/// Parses a byte count ([`bypass_common::size::parse_size`]: a number with an optional
/// `K`, `M` or `G` suffix, powers of 1024), with an error message for clap.
pub fn parse_size(s: &str) -> Result<u64, String> {
    bypass_common::size::parse_size(s).map_err(|e| format!("'{s}' {e}"))
}

/// [`parse_size`] for a size held in memory (a write's length).
pub fn parse_usize(s: &str) -> Result<usize, String> {
    usize::try_from(parse_size(s)?).map_err(|_| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use std::{
        net::{Ipv4Addr, SocketAddr, TcpListener},
        time::Duration,
    };

    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("banana").unwrap_err().contains("'banana'"));
        assert!(parse_size("1T").is_err());
    }

    fn free_port() -> u16 {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Client and server over loopback, no datapath involved: the tool itself is right.
    fn loopback(
        listen: SocketAddr,
        client: client::ClientArgs,
        connections: u64,
    ) -> (Report, Report) {
        let ready = std::env::temp_dir().join(format!("bt-peer-ready-{}", listen.port()));
        let _ = std::fs::remove_file(&ready);
        let sopts = server::ServerOpts {
            listen,
            connections,
            ready_file: Some(ready.clone()),
            idle_timeout: Duration::from_secs(10),
            reply_delay: Duration::ZERO,
            go_file: None,
        };
        let srv = std::thread::spawn(move || server::run(&sopts).unwrap().unwrap());
        while !ready.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let c = client::run(listen, &client);
        let s = srv.join().unwrap();
        std::fs::remove_file(&ready).unwrap();
        (c, s)
    }

    fn opts() -> client::ClientArgs {
        client::ClientArgs {
            send: 3 << 20,
            recv: (2 << 20) + 17,
            streams: 4,
            connections: 8,
            msg_size: 65536,
            stream_base: 100,
            idle_timeout_secs: 10,
            ..client::ClientArgs::default()
        }
    }

    fn here(port: u16) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    }

    #[test]
    fn streams_verify_over_loopback() {
        let (c, s) = loopback(here(free_port()), opts(), 8);
        assert!(c.ok && s.ok, "{c:?} {s:?}");
        assert_eq!(c.connections, 8);
        assert_eq!(c.bytes_sent, 8 * (3 << 20));
        assert_eq!(c.bytes_received, 8 * ((2 << 20) + 17));
        assert_eq!(s.bytes_received, c.bytes_sent);
        assert_eq!(s.bytes_sent, c.bytes_received);
    }

    #[test]
    fn pingpong_over_loopback() {
        let mut o = opts();
        o.pingpong = Some(200);
        o.msg_size = 64;
        o.streams = 1;
        o.connections = 1;
        let (c, s) = loopback(here(free_port()), o, 1);
        assert!(c.ok && s.ok, "{c:?} {s:?}");
        assert_eq!(c.rtt.as_ref().map(|r| r.count), Some(200));
        assert_eq!(s.bytes_received, 200 * 64);
    }

    #[test]
    fn client_args_round_trip_through_the_command_line() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            args: client::ClientArgs,
        }
        let want = client::ClientArgs {
            send: 5 << 20,
            recv: 7,
            streams: 3,
            connections: 9,
            msg_size: 1000,
            rate: 1 << 18,
            prefix: 4,
            prefix_after: 3,
            pingpong: Some(5),
            stream_base: 42,
            cpus: Vec::new(),
            idle_timeout_secs: 0,
            greet: true,
        };
        let argv = std::iter::once("peer".to_owned()).chain(want.args());
        assert_eq!(Line::try_parse_from(argv).unwrap().args, want);
        // Defaults agree too: an empty command line is `ClientArgs::default()`.
        assert_eq!(
            Line::try_parse_from(["peer"]).unwrap().args,
            client::ClientArgs::default()
        );
    }

    #[test]
    fn server_catches_a_client_that_sends_too_much() {
        use std::io::Write as _;
        let port = free_port();
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let srv = std::thread::spawn(move || {
            server::run(&server::ServerOpts {
                listen,
                connections: 1,
                ready_file: None,
                idle_timeout: Duration::from_secs(10),
                reply_delay: Duration::ZERO,
                go_file: None,
            })
            .unwrap()
            .unwrap()
        });
        let mut sock = loop {
            match std::net::TcpStream::connect(listen) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let h = wire::Header {
            mode: wire::Mode::Stream,
            stream: 1,
            c2s: 10,
            s2c: 0,
            msg_size: 10,
            rate: 0,
            greet: false,
        };
        let mut data = vec![0u8; 20];
        pattern::Pattern::new(1, pattern::Direction::ClientToServer).fill(&mut data);
        sock.write_all(&h.encode()).unwrap();
        sock.write_all(&data).unwrap();
        sock.shutdown(std::net::Shutdown::Write).unwrap();
        let s = srv.join().unwrap();
        assert!(!s.ok);
        assert_eq!(s.failures[0].kind, "extra");
    }
}
