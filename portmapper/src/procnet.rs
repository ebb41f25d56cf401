//! Which process listens on which TCP port, from Linux's `/proc`.
//!
//! The daemon accepts a registration "P is served by SDP listener Q" only
//! from a process that really holds listening sockets on P and Q (DESIGN
//! §5). The kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`) gives
//! each listening socket's address, port and inode; a process's open sockets
//! are the `socket:[inode]` links in `/proc/<pid>/fd`. Reading another
//! user's `/proc/<pid>/fd` needs the same uid or root; a daemon run by an
//! unprivileged user checks the socket table's owner uid instead
//! ([`user_holds_listener`]).
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// TCP state LISTEN in `/proc/net/tcp` (`TCP_LISTEN` = 10).
const TCP_LISTEN: &str = "0A";

/// A listening TCP socket from the kernel's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenSocket {
    /// Local address (IPv4-mapped IPv6 addresses are given as IPv4).
    pub addr: IpAddr,
    /// Local port.
    pub port: u16,
    /// Socket inode.
    pub inode: u64,
    /// The user that created the socket.
    pub uid: u32,
}

fn parse_addr(hex: &str) -> Option<IpAddr> {
    // The kernel prints each 32-bit word of the address in host byte order.
    let word = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::to_ne_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(hex)?))),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(hex.get(i * 8..i * 8 + 8)?)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(b)).to_canonical())
        }
        _ => None,
    }
}

/// The listening sockets in the text of `/proc/net/tcp` or `/proc/net/tcp6`.
/// Lines that do not parse are skipped.
pub fn parse_table(text: &str) -> Vec<ListenSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when
            // retrnsmt uid timeout inode ...
            if f.len() < 10 || f[3] != TCP_LISTEN {
                return None;
            }
            let (a, p) = f[1].split_once(':')?;
            Some(ListenSocket {
                addr: parse_addr(a)?,
                port: u16::from_str_radix(p, 16).ok()?,
                inode: f[9].parse().ok()?,
                uid: f[7].parse().ok()?,
            })
        })
        .collect()
}

/// All listening TCP sockets of this network namespace.
pub fn listening_sockets() -> io::Result<Vec<ListenSocket>> {
    let mut out = parse_table(&fs::read_to_string("/proc/net/tcp")?);
    // No IPv6 on this host is not an error.
    if let Ok(t) = fs::read_to_string("/proc/net/tcp6") {
        out.extend(parse_table(&t));
    }
    Ok(out)
}

/// The inodes of the sockets process `pid` has open.
pub fn socket_inodes(pid: u32) -> io::Result<HashSet<u64>> {
    let mut out = HashSet::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(link) = fs::read_link(e?.path()) else {
            continue; // closed meanwhile
        };
        let s = link.to_string_lossy();
        if let Some(n) = s.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            if let Ok(i) = n.parse() {
                out.insert(i);
            }
        }
    }
    Ok(out)
}

/// Does one of `inodes` listen on `addr`:`port`? An unspecified `addr`
/// matches only a wildcard listener of that family (`::` also stands for a
/// dual-stack one).
pub fn holds_listener(
    table: &[ListenSocket],
    inodes: &HashSet<u64>,
    addr: IpAddr,
    port: u16,
) -> bool {
    let addr = addr.to_canonical();
    table
        .iter()
        .any(|s| s.port == port && s.addr == addr && inodes.contains(&s.inode))
}

/// Does a socket of user `uid` listen on `addr`:`port` (same address rules
/// as [`holds_listener`])? The check a daemon can make when it may not read
/// the caller's `/proc/<pid>/fd`: it proves the user, not the process.
pub fn user_holds_listener(table: &[ListenSocket], uid: u32, addr: IpAddr, port: u16) -> bool {
    let addr = addr.to_canonical();
    table
        .iter()
        .any(|s| s.port == port && s.addr == addr && s.uid == uid)
}

/// Does process `pid` listen on TCP `addr`:`port`?
pub fn process_listens_on(pid: u32, addr: IpAddr, port: u16) -> io::Result<bool> {
    let table = listening_sockets()?;
    let inodes = socket_inodes(pid)?;
    Ok(holds_listener(&table, &inodes, addr, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parse_lines() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1389 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:1389 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 12346 1\n   2: garbage\n";
        let t = parse_table(v4);
        assert_eq!(
            t,
            [ListenSocket {
                addr: "127.0.0.1".parse().unwrap(),
                port: 5001,
                inode: 12345,
                uid: 1000,
            }]
        );
        let v6 = "header\n   0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1\n   1: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 778 1\n";
        let t = parse_table(v6);
        assert_eq!(t[0].addr, "::1".parse::<IpAddr>().unwrap());
        assert_eq!((t[0].port, t[0].inode), (22, 777));
        assert_eq!(t[1].addr, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(t[1].port, 80);
    }

    #[test]
    fn finds_own_listener() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(process_listens_on(me, lo, port).unwrap());
        assert!(!process_listens_on(me, "0.0.0.0".parse().unwrap(), port).unwrap());
        let table = listening_sockets().unwrap();
        let my_uid = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap();
        assert!(user_holds_listener(&table, my_uid, lo, port));
        assert!(!user_holds_listener(
            &table,
            my_uid.wrapping_add(1),
            lo,
            port
        ));
        drop(l);
        assert!(!process_listens_on(me, lo, port).unwrap());
    }
}
