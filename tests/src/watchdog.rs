//! A test's own time limit, below the runner's (`.config/nextest.toml`
//! terminates a test after 120 s): when it runs out, the test prints what
//! it was waiting on — the state export of every preloaded process, the
//! programs' output — stops the programs it started and aborts, so that a
//! hang fails with its cause on the page instead of running until CI's
//! limit.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long an end-to-end test may run before its watchdog fires: a
/// quarter of that is what a test is sized for on a debug build on two
/// cores.
pub const LIMIT: Duration = Duration::from_secs(100);

/// Fires unless dropped within its limit (see the module documentation).
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    /// Arms a watchdog for `what`: after `limit`, `state()` is printed
    /// (given at most 5 s: a state behind a lock the hang holds is
    /// reported missing rather than hanging the watchdog too), every
    /// process this one started is killed, and the process aborts.
    pub fn arm(
        what: &str,
        limit: Duration,
        state: impl FnOnce() -> String + Send + 'static,
    ) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let watched = done.clone();
        let what = what.to_owned();
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                let (lock, cond) = &*watched;
                let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                let (guard, _) = cond
                    .wait_timeout_while(guard, limit, |done| !*done)
                    .unwrap_or_else(|p| p.into_inner());
                if *guard {
                    return;
                }
                drop(guard);
                eprintln!("watchdog: {what} still running after {limit:?}");
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(state());
                });
                match rx.recv_timeout(Duration::from_secs(5)) {
                    Ok(text) => eprintln!("watchdog: state of {what}:\n{text}"),
                    Err(_) => eprintln!("watchdog: the state of {what} did not come in 5 s"),
                }
                kill_descendants(std::process::id());
                std::process::abort();
            })
            .expect("start the watchdog thread");
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cond) = &*self.done;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cond.notify_all();
    }
}

/// SIGKILL to every process below `pid` (children first found in /proc,
/// then theirs): an aborted test must not leave its programs running.
fn kill_descendants(pid: u32) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let children: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent(p) == Some(pid))
        .collect();
    for child in children {
        kill_descendants(child);
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
    }
}

/// The parent pid of `pid` (field 4 of /proc/PID/stat, after the command
/// name in parentheses).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
