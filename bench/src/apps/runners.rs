//! One run of a workload's client in pod `a` against its running service, through the
//! runners of `testbed::apps`: the tool's own rate (and mean latency where it reports
//! one), or an error when the run did not do everything it was asked (a request
//! failed, a byte came back wrong or not at all, the client timed out).

use anyhow::{Result, ensure};
use testbed::apps::{
    On,
    go::{Expect, GrpcCheck, HttpCheck, StreamCheck},
    http::{Ab, Wrk, curl_download},
    iperf::Iperf,
    postgres::Pgbench,
    redis::Benchmark,
};

use super::{
    catalogue::{
        BIG_FILE, BIG_FILE_BYTES, Client, GRPC_MESSAGE_BYTES, HTTP_CONCURRENCY, HTTP_SIZES,
        PGBENCH_CLIENTS, PGBENCH_THREADS, REDIS_CLIENTS, REDIS_VALUE_BYTES, SMALL_FILE, Scale,
        Service, Workload,
    },
    services::Started,
};

/// What a run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Outcome {
    /// The rate, in the workload's unit.
    pub(crate) value: f64,
    /// Mean latency, µs, where the tool reports it.
    pub(crate) latency_us: Option<f64>,
}

impl Outcome {
    fn rate(value: f64) -> Self {
        Self {
            value,
            latency_us: None,
        }
    }
}

/// Runs `w`'s client on `a` against `service` at `scale`.
pub(crate) fn run(w: &Workload, service: &Started, a: On<'_>, scale: Scale) -> Result<Outcome> {
    let timeout = scale.client_timeout();
    let front = service.front;
    match w.client {
        Client::RedisBenchmark { pipeline, requests } => {
            let tests = ["set", "get"];
            let rows = Benchmark {
                clients: REDIS_CLIENTS,
                requests: scale.count(requests),
                pipeline,
                data_size: REDIS_VALUE_BYTES,
                tests: tests.iter().map(|t| (*t).to_owned()).collect(),
            }
            .run(a, front, timeout)?;
            // Every test runs the same number of requests: requests over the time of all.
            let secs_per_request: f64 = rows.iter().map(|r| 1.0 / r.rps).sum();
            let latencies: Option<Vec<f64>> = rows.iter().map(|r| r.avg_latency_ms).collect();
            Ok(Outcome {
                value: rows.len() as f64 / secs_per_request,
                latency_us: latencies.map(|l| l.iter().sum::<f64>() / l.len() as f64 * 1e3),
            })
        }
        Client::Wrk => {
            let r = Wrk {
                threads: 1,
                connections: HTTP_CONCURRENCY,
                duration: scale.wrk_duration(),
            }
            .run(a, &service.url(SMALL_FILE))?;
            ensure!(
                r.socket_errors == 0 && r.non_2xx_3xx == 0 && r.requests > 0,
                "wrk: {r:?}"
            );
            Ok(Outcome {
                value: r.rps,
                latency_us: r.latency_us,
            })
        }
        Client::Ab {
            keep_alive,
            requests,
        } => {
            let requests = scale.count(requests);
            let r = Ab {
                requests,
                concurrency: HTTP_CONCURRENCY,
                keep_alive,
            }
            .run(a, &service.url(SMALL_FILE), timeout)?;
            ensure!(
                r.complete == u64::from(requests) && r.failed == 0 && r.non_2xx == 0,
                "ab: {r:?}, want {requests} complete and none failed"
            );
            Ok(Outcome::rate(r.rps))
        }
        Client::Download => {
            let r = curl_download(a, &service.url(BIG_FILE), timeout)?;
            let want = scale.amount(BIG_FILE_BYTES);
            ensure!(r.bytes == want, "curl: {} B of {want}", r.bytes);
            Ok(Outcome::rate(r.bytes_per_sec / 1e6))
        }
        Client::Pgbench {
            connect_per_transaction,
            transactions,
        } => {
            let r = Pgbench {
                clients: PGBENCH_CLIENTS,
                threads: PGBENCH_THREADS,
                transactions: scale.count(transactions),
                connect_per_transaction,
                select_only: true,
            }
            .run(a, front, timeout)?;
            ensure!(r.processed == r.expected && r.failed == 0, "pgbench: {r:?}");
            Ok(Outcome {
                value: r.tps,
                latency_us: r.latency_ms.map(|ms| ms * 1e3),
            })
        }
        Client::Iperf {
            write_size,
            streams,
            reverse,
            bytes,
        } => {
            let run = Iperf {
                bytes: scale.amount(bytes),
                streams,
                write_size,
                reverse,
            };
            let r = run.run(a, front, timeout)?;
            ensure!(
                r.sent >= run.bytes && r.streams == u64::from(streams),
                "iperf3: {r:?}, want {} B on {streams} streams",
                run.bytes
            );
            // Whether every byte arrived is the apps tests' to check: a receiver may
            // stop counting at the end-of-test message with a segment still unread
            // (seen here on the normal path with -R: 1504 B short of 256 MiB).
            Ok(Outcome::rate(r.bits_per_second / 1e9))
        }
        Client::Stream { connections, bytes } => {
            let bytes = scale.amount(bytes);
            let expect = if service.service == Service::GoCopyProxy {
                Expect::Digest
            } else {
                Expect::Echo
            };
            let r = StreamCheck {
                expect,
                ..StreamCheck::echo(front, connections, bytes)
            }
            .run(a)?;
            let total = u64::from(connections) * bytes;
            ensure!(
                r.failures.is_empty()
                    && r.exact == connections
                    && r.bytes_sent == total
                    && r.bytes_back == total,
                "streamcheck: {} of {connections} connections exact, {} of {total} B back: {}",
                r.exact,
                r.bytes_back,
                r.failures.join("; ")
            );
            Ok(Outcome::rate(r.bytes_sent as f64 / r.secs / 1e6))
        }
        Client::HttpRequests { rounds } => {
            let rounds = scale.count(rounds);
            let r = HttpCheck {
                connect: front,
                rounds,
                sizes: HTTP_SIZES.to_vec(),
                keep_alive: true,
            }
            .run(a)?;
            ensure!(
                r.failures.is_empty() && r.exact == r.requests && r.requests == 2 * rounds,
                "httpcheck: {} of {} requests exact: {}",
                r.exact,
                r.requests,
                r.failures.join("; ")
            );
            Ok(Outcome::rate(f64::from(r.requests) / r.secs))
        }
        Client::GrpcStream { messages } => {
            let messages = scale.count(messages);
            let r = GrpcCheck {
                connect: front,
                messages,
                sizes: vec![GRPC_MESSAGE_BYTES],
            }
            .run(a)?;
            ensure!(
                r.failures.is_empty() && r.exact == messages && r.sha256_sent == r.sha256_back,
                "grpcclient: {} of {messages} messages exact: {}",
                r.exact,
                r.failures.join("; ")
            );
            Ok(Outcome::rate(f64::from(messages) / r.secs))
        }
    }
}
