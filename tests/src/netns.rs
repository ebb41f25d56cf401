//! Two hosts on one machine: a pair of network namespaces joined by a veth
//! pair, for tests that need a link they can take down. Needs root and
//! `ip` (iproute2); [`NetPair::create`] says why not otherwise, for the
//! test to skip with that message. The namespaces (and with them the veth
//! pair) are removed on drop, also when the test fails.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One side of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// See the module documentation.
pub struct NetPair {
    /// Namespace names, veth names, addresses (a /24) of sides A and B.
    pub ns: [String; 2],
    pub veth: [String; 2],
    pub addr: [Ipv4Addr; 2],
    /// The namespaces, open, for `setns` in the programs started in them.
    files: Vec<File>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetPair {
    /// Creates namespaces named after `tag`, the process and a counter
    /// (unique among concurrent tests), a veth pair between them, with
    /// 10.77.0.1/24 on A and 10.77.0.2/24 on B, every link up. `Err` says
    /// why it cannot be done here (not root, no `ip`, no namespaces).
    pub fn create(tag: &str) -> Result<NetPair, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: network namespaces need CAP_SYS_ADMIN".into());
        }
        if Command::new("ip")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            return Err("`ip` (iproute2) is not installed".into());
        }
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 100_000, n);
        let mut pair = NetPair {
            ns: [format!("sdp-{tag}-{id}-a"), format!("sdp-{tag}-{id}-b")],
            // Interface names: at most 15 bytes.
            veth: [format!("sv{id}a"), format!("sv{id}b")],
            addr: [Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2)],
            files: Vec::new(),
        };
        // From here the drop removes whatever was made.
        for ns in &pair.ns {
            ip(&["netns", "add", ns])?;
        }
        let [va, vb] = &pair.veth;
        let [na, nb] = &pair.ns;
        let mac = ["02:77:00:00:00:01", "02:77:00:00:00:02"];
        ip(&[
            "link", "add", va, "address", mac[0], "type", "veth", "peer", "name", vb, "address",
            mac[1],
        ])?;
        ip(&["link", "set", va, "netns", na])?;
        ip(&["link", "set", vb, "netns", nb])?;
        for (i, (ns, veth)) in pair.ns.iter().zip(&pair.veth).enumerate() {
            let cidr = format!("{}/24", pair.addr[i]);
            ip(&["-n", ns, "addr", "add", &cidr, "dev", veth])?;
            // Permanent neighbour entries: with the link down, segments
            // are lost, never refused by a failed ARP resolution (which
            // would end a TCP connection with EHOSTUNREACH instead of
            // ETIMEDOUT, depending on the neighbour cache's timers).
            let other = pair.addr[1 - i].to_string();
            ip(&[
                "-n",
                ns,
                "neigh",
                "replace",
                &other,
                "lladdr",
                mac[1 - i],
                "dev",
                veth,
                "nud",
                "permanent",
            ])?;
            ip(&["-n", ns, "link", "set", veth, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        for ns in &pair.ns {
            let f = File::open(format!("/var/run/netns/{ns}"))
                .map_err(|e| format!("open namespace {ns}: {e}"))?;
            pair.files.push(f);
        }
        Ok(pair)
    }

    fn index(side: Side) -> usize {
        match side {
            Side::A => 0,
            Side::B => 1,
        }
    }

    pub fn addr(&self, side: Side) -> Ipv4Addr {
        self.addr[Self::index(side)]
    }

    /// Makes `cmd` start its program inside `side`'s namespace (`setns`
    /// in the child before `exec`: only the program itself runs there,
    /// with the environment the command has).
    pub fn enter(&self, side: Side, cmd: &mut Command) {
        let fd = self.files[Self::index(side)].as_raw_fd();
        // SAFETY: setns is async-signal-safe; the descriptor stays open
        // in the parent (and so in the child) until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }

    /// `ip link set <veth> down` inside `side`'s namespace.
    pub fn link_down(&self, side: Side) {
        let i = Self::index(side);
        ip(&["-n", &self.ns[i], "link", "set", &self.veth[i], "down"])
            .unwrap_or_else(|e| panic!("take the link down: {e}"));
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        self.files.clear();
        // Deleting a namespace deletes the veth end in it, and with it the
        // pair; programs still running in it keep it until they end.
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
        // A pair left in this namespace by a setup that failed half way.
        let _ = ip(&["link", "del", &self.veth[0]]);
    }
}
