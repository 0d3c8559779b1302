//! A background thread of the agent's datapath (the heartbeat, the full-map watcher,
//! the leave thread): named, told to stop through a flag it polls, and stopped and
//! joined when its guard is dropped.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long [`nap_until`] sleeps between looks at the stop flag: what a drop waits at
/// most for a thread that naps.
const NAP: Duration = Duration::from_millis(50);

/// The thread; stops when dropped.
#[derive(Debug)]
pub struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Spawns thread `name` running `body`, which is given the stop flag and returns
    /// soon after it is set.
    pub fn spawn(
        name: &str,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps in short naps until `at`, so that a stop is not kept waiting a whole period;
/// whether `at` came (`false`: `stop` was set first).
pub fn nap_until(stop: &AtomicBool, at: Instant) -> bool {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(NAP);
        if Instant::now() >= at {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_until_dropped() {
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = Worker::spawn("worker-test", move |stop| {
            tx.send(std::thread::current().name().map(str::to_owned))
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            tx.send(None).unwrap();
        })
        .unwrap();
        assert_eq!(rx.recv().unwrap().as_deref(), Some("worker-test"));
        drop(worker);
        assert_eq!(
            rx.try_recv().unwrap(),
            None,
            "stopped and joined by the drop"
        );
    }

    #[test]
    fn naps_until_the_time_or_the_stop() {
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        assert!(nap_until(&stop, t0 + NAP / 2));
        assert!(Instant::now() >= t0 + NAP / 2);
        stop.store(true, Ordering::Relaxed);
        assert!(!nap_until(&stop, t0 + Duration::from_secs(60)));
    }
}
