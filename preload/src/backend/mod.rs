//! The SDP engine behind the hooks: [`crate::sdp`]'s traits implemented
//! over `sdp-core`'s stream layer and the `portmapper` client, installed by
//! `abi::process::init` (unless `SDP_ENGINE=0`).
//!
//! * [`connect`] — the Connecting Peer: CpPort, port mapper, TCP to S':Q,
//!   MPA/Hello, or the fallback to TCP on the same fd number.
//! * [`listener`] — the hidden SDP listener, its registration, and the
//!   Accepting Peer's setup of each connection.
//! * [`endpoint`] — one SDP connection behind an application fd.
//! * [`service`] — the thread that carries nonblocking setups on and
//!   publishes statistics.
//! * [`owner`] — which process drives a connection a `fork` made shared.
//!
//! Inside, imports go one way too: `connect` and `listener` use
//! `endpoint`, which uses `owner`; they hand work to `service`, which
//! knows it only as [`service::Task`] trait objects.
//!
//! Environment: `SDP_PM_PORT` (the port mapper's UDP port, default 3935),
//! `SDP_PM_CONTROL` (its control socket), `SDP_STAT_INTERVAL_MS`,
//! `SDP_ENGINE=0` (no SDP at all). The progress thread of `sdp-core` moves
//! the bytes; one per process, restarted in a child of `fork`.

pub mod connect;
pub mod endpoint;
pub mod listener;
pub mod owner;
pub mod service;

use crate::sdp::{self, ConnectOutcome, SdpBackend, SdpListener};
use crate::table::TcpReason;
use libc::c_int;
use portmapper::client::ClientConfig;
use portmapper::net::PmClient;
use sdp_core::stream::progress;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The backend (stateless: the state is in the fd table and the statics
/// of the modules).
pub struct Backend;

static BACKEND: Backend = Backend;

/// Installs the backend for the hooks.
pub fn install() {
    // The SDP layer's diagnostics (abortive closes and their rule,
    // Terminates) go through this library's log: its level and file.
    sdp_core::log::set_sink(|line| crate::log!(crate::log::Level::Info, "sdp: {line}"));
    progress::set_thread_start(crate::sys::guard::library_thread);
    sdp::install_backend(&BACKEND);
}

/// The port mapper's UDP port: `SDP_PM_PORT`, else the draft's 3935.
pub fn pm_port() -> u16 {
    std::env::var("SDP_PM_PORT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(portmapper::wire::DEFAULT_PORT)
}

/// The process's PM client: its caches serve every connection.
pub(crate) fn pm() -> &'static PmClient {
    static PM: OnceLock<PmClient> = OnceLock::new();
    PM.get_or_init(|| {
        PmClient::new(ClientConfig {
            server_port: pm_port(),
            ..ClientConfig::default()
        })
    })
}

/// The PM client's cache changed: `sdp-stat` shows it (`--explain`).
pub(crate) fn pm_cache_changed() {
    crate::stat::publish_pm_cache(|| pm().entries(crate::stat_format::PM_CACHE_MAX));
}

/// How long the short tail of a large write may wait for the next write
/// (`Config::coalesce`), unless the program set TCP_NODELAY: longer than a
/// scheduler time slice, so that a streaming writer descheduled for a few
/// milliseconds still finds its tail waiting (docs/design.md §9).
const COALESCE_US: u64 = 5000;

/// Receive Private Buffers a connection's pool may grow to from the 16 it
/// starts with (`Config::max_bufs`): 4 MiB of 64 KiB buffers, in the range
/// of Linux TCP's receive buffer autotuning (`tcp_rmem` max 6 MiB). An
/// idle connection holds none of it (docs/design.md §7).
const MAX_BUFS: u16 = 64;

/// How long a blocking reader polls its socket before it sleeps, while
/// answers come quickly (`Config::busy_poll_us`): a 64-byte round trip
/// between two such readers takes a quarter of TCP's here, where a
/// sleeping one costs a wake-up on each end (docs/design.md §9).
const BUSY_POLL_US: u32 = 50;

/// The SDP connection parameters: the defaults, with the Zcopy policy
/// from `SDP_ZCOPY` (off, read, write, both; default off) and
/// `SDP_ZCOPY_THRESHOLD` (the Bcopy Threshold, default 256K): blocking
/// reads and writes larger than it go by Zcopy; `SDP_ZCOPY_SINK_WAIT_MS`
/// (how long a writer waits for the reader's next SinkAvail, default 10
/// with Write Zcopy on); `SDP_LEND_ABOVE` (blocking sends larger than it
/// go straight from the program's buffer; default 128K); `SDP_COALESCE_US`
/// (how long a large write's short tail may wait for the next write,
/// default 5000); `SDP_BUSY_POLL_US` (how long a blocking reader polls
/// before it sleeps; default 50 where the process may run on more than one
/// core, else 0: polling on the only core would hold off the peer it waits
/// for); `SDP_LOCAL` (off: no same-host path, default on)
/// (docs/preload.md).
pub(crate) fn sdp_config() -> sdp_core::conn::Config {
    use sdp_core::stream::zcopy::{parse_size, ZcopyMode};
    static CONFIG: OnceLock<sdp_core::conn::Config> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
            let mode = match env("SDP_ZCOPY").map(|v| v.parse::<ZcopyMode>()) {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    crate::log!(crate::log::Level::Warn, "SDP_ZCOPY: {e}; Zcopy off");
                    ZcopyMode::Off
                }
                None => ZcopyMode::Off,
            };
            let threshold = env("SDP_ZCOPY_THRESHOLD")
                .and_then(|v| parse_size(&v))
                .unwrap_or(256 * 1024);
            let mut config = sdp_core::conn::Config::default();
            mode.apply(&mut config, threshold);
            match env("SDP_LEND_ABOVE").as_deref() {
                None => {}
                Some("off") => config.lend_above = u64::MAX,
                Some(v) => match parse_size(v) {
                    Some(n) => config.lend_above = n,
                    None => crate::log!(
                        crate::log::Level::Warn,
                        "SDP_LEND_ABOVE: {v:?} is neither a size nor off; {}",
                        config.lend_above
                    ),
                },
            }
            config.coalesce = std::time::Duration::from_micros(COALESCE_US);
            config.max_bufs = MAX_BUFS;
            if let Some(v) = env("SDP_COALESCE_US") {
                match v.parse::<u64>() {
                    Ok(us) => config.coalesce = std::time::Duration::from_micros(us),
                    Err(_) => crate::log!(
                        crate::log::Level::Warn,
                        "SDP_COALESCE_US: {v:?} is not a number of microseconds; {COALESCE_US}"
                    ),
                }
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            config.busy_poll_us = if cores > 1 { BUSY_POLL_US } else { 0 };
            if let Some(v) = env("SDP_BUSY_POLL_US") {
                match v.parse::<u32>() {
                    Ok(us) => config.busy_poll_us = us,
                    Err(_) => crate::log!(
                        crate::log::Level::Warn,
                        "SDP_BUSY_POLL_US: {v:?} is not a number of microseconds; {}",
                        config.busy_poll_us
                    ),
                }
            }
            // The same-host path (DESIGN §9): on unless turned off.
            config.local = match env("SDP_LOCAL").as_deref() {
                None | Some("on") => true,
                Some("off") => false,
                Some(v) => {
                    crate::log!(
                        crate::log::Level::Warn,
                        "SDP_LOCAL: {v:?} is neither on nor off; on"
                    );
                    true
                }
            };
            if let Some(v) = env("SDP_ZCOPY_SINK_WAIT_MS") {
                match v.parse::<u64>() {
                    Ok(ms) if config.write_zcopy => {
                        config.sink_avail_wait = std::time::Duration::from_millis(ms);
                    }
                    Ok(_) => {}
                    Err(_) => crate::log!(
                        crate::log::Level::Warn,
                        "SDP_ZCOPY_SINK_WAIT_MS: {v:?} is not a number of milliseconds; {} ms",
                        config.sink_avail_wait.as_millis()
                    ),
                }
            }
            config
        })
        .clone()
}

impl SdpBackend for Backend {
    fn connect(
        &self,
        fd: RawFd,
        dest: SocketAddr,
        nonblocking: bool,
        sdp_only: bool,
    ) -> ConnectOutcome {
        connect::start(fd, dest, nonblocking, sdp_only)
    }

    fn listen(
        &self,
        fd: RawFd,
        local: SocketAddr,
        backlog: c_int,
    ) -> Result<Arc<dyn SdpListener>, TcpReason> {
        match listener::open(fd, local, backlog) {
            Ok(l) => Ok(Arc::new(l)),
            Err(e) => {
                crate::log!(
                    crate::log::Level::Warn,
                    "fd {fd}: no hidden SDP listener for {local}: {e}"
                );
                Err(TcpReason::Internal)
            }
        }
    }

    fn fork_prepare(&self) {
        progress::fork_prepare();
    }

    fn fork_parent(&self) {
        progress::fork_parent();
    }

    fn fork_child(&self) {
        progress::fork_child();
        service::fork_child();
    }

    fn exiting(&self, deadline: Instant) {
        // The kernel finishes a TCP close after the process ended; an SDP
        // connection's bytes are in this process until written. So exit
        // waits until each closed connection's data and DisConn are in its
        // socket and the peer's TCP acknowledged them, not for the peer's
        // own close.
        let left = progress::wait_written(deadline, |fd| unacked(fd.as_raw_fd()) == Some(0));
        if left > 0 {
            crate::log!(
                crate::log::Level::Warn,
                "exit: {left} SDP connection(s) still had bytes the peer had not taken after SDP_EXIT_FLUSH_MS"
            );
        }
    }

    fn pending(&self) -> usize {
        owner::pending()
    }
}

/// Bytes of `fd`'s send queue the peer's TCP has not acknowledged
/// (SIOCOUTQ, which Linux numbers as TIOCOUTQ).
fn unacked(fd: RawFd) -> Option<c_int> {
    let mut n: c_int = 0;
    // SAFETY: SIOCOUTQ writes one int.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (r == 0).then_some(n)
}
