//! Runs `tshark` over a capture and returns the decoded fields, so tests can
//! let Wireshark's `iwarp_mpa` and `iwarp_ddp_rdmap` dissectors check our
//! wire format independently of our own parsers.

use std::io::Write;
use std::process::Command;

/// Heuristic ULP dissectors that would claim our Send payloads (test
/// patterns, SDP messages) as their own protocol and then call them
/// malformed are turned off: they sit above RDMAP, so that hides nothing
/// of MPA, DDP or RDMAP. And TCP tries the heuristic dissectors (MPA's)
/// before the one registered for the port: a capture's port may be one
/// Wireshark assigns to another protocol (DNP3 on 20000, say).
const DISABLED: [&str; 6] = [
    "--disable-protocol",
    "rpcordma",
    "--disable-protocol",
    "smb_direct",
    "-o",
    "tcp.try_heuristic_first:TRUE",
];

/// One decoded frame: for every requested field, its values (a field that
/// occurs several times in the frame, such as markers, has several).
pub type Frame = Vec<Vec<String>>;

/// Decodes `pcap` with `tshark -T fields` and returns one row per frame that
/// matches `filter`, with the values of `fields` in order.
///
/// # Panics
///
/// When tshark is missing or fails: the tests that call this exist to run it.
pub fn decode(pcap: &[u8], filter: &str, fields: &[&str]) -> Vec<Frame> {
    let mut file = tempfile();
    file.1.write_all(pcap).expect("write capture");
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"])
        .arg(&file.0)
        .args(["-o", "tcp.check_checksum:TRUE"])
        .args(DISABLED)
        .args([
            "-Y",
            filter,
            "-T",
            "fields",
            "-E",
            "separator=\t",
            "-E",
            "occurrence=a",
        ])
        .args(["-E", "aggregator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark is installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&file.0).ok();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            line.split('\t')
                .map(|v| {
                    if v.is_empty() {
                        Vec::new()
                    } else {
                        v.split('|').map(str::to_owned).collect()
                    }
                })
                .collect()
        })
        .collect()
}

/// The verbose (`-O`) text of the given protocols, for facts the dissector
/// only prints, such as whether a CRC is good.
pub fn verbose(pcap: &[u8], protocols: &str) -> String {
    let mut file = tempfile();
    file.1.write_all(pcap).expect("write capture");
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&file.0)
        .args(DISABLED)
        .args(["-O", protocols])
        .output()
        .expect("tshark is installed");
    std::fs::remove_file(&file.0).ok();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Returns every expert-info message tshark attaches to the capture, one per
/// line, as `severity group message`.
pub fn expert_infos(pcap: &[u8]) -> Vec<String> {
    let mut file = tempfile();
    file.1.write_all(pcap).expect("write capture");
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&file.0)
        .args(DISABLED)
        .args([
            "-T",
            "fields",
            "-e",
            "_ws.expert.severity",
            "-e",
            "_ws.expert.group",
            "-e",
            "_ws.expert.message",
        ])
        .args(["-E", "occurrence=a", "-E", "aggregator=|"])
        .output()
        .expect("tshark is installed");
    std::fs::remove_file(&file.0).ok();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn tempfile() -> (std::path::PathBuf, std::fs::File) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "sdp-tests-{}-{}.pcap",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::File::create(&path).expect("create capture file");
    (path, file)
}
