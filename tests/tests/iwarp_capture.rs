//! What `iwarp-perf` really puts on the wire, checked by an independent
//! decoder: a live capture of loopback TCP while iwarp-perf moves data with
//! Send, RDMA Write and RDMA Read, markers off and on, decoded by tshark's
//! `iwarp_mpa` and `iwarp_ddp_rdmap` dissectors. Every TCP segment must be
//! the MPA Request, the Reply or exactly one FPDU that decodes down to
//! RDMAP; every CRC must be good; nothing may be malformed; the payload of
//! the data messages must add up to what iwarp-perf moved (and iwarp-perf
//! itself checks every octet it moved).
//!
//! The dissector wants one FPDU per TCP segment, which iwarp-perf's
//! `--aligned` mode provides (docs/wire.md): each FPDU is written on its
//! own once TCP has sent everything before it. `--mss` keeps FPDUs well
//! below what Linux puts in one loopback segment (at most half the peer's
//! window), and `--depth 1` makes each direction's byte stream the same
//! from run to run.
//!
//! With markers, this Wireshark dissector counts one marker too many in an
//! FPDU that ends exactly where the next marker falls (RFC 5044 §4.3: that
//! marker belongs to the following FPDU, with FPDUPTR 0, as we send it),
//! and loses track of the stream from there. The test therefore computes,
//! from TCP sequence numbers alone, whether a run has such an FPDU, and
//! uses the first of a few MSS values whose run has none.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use sdp_tests::bins::cargo_bin;
use sdp_tests::capture::{free_port, LiveCapture};
use sdp_tests::tshark;

const SIZE: u64 = 100 * 1024;
const ITERS: u64 = 3;
/// Tried in turn for marker runs (see the module docs).
const MSS: [u32; 4] = [16384, 12000, 20000, 24000];

/// A running `iwarp-perf server`, stopped on drop.
struct Server(Child);

impl Server {
    fn start(perf: &Path, port: u16) -> Server {
        let mut child = Command::new(perf)
            .args(["server", "--bind", "127.0.0.1", "--port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start iwarp-perf server");
        // It prints its first line once it listens; the rest is drained.
        let mut out = BufReader::new(child.stdout.take().expect("server stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("server's first line");
        assert!(line.contains("listening"), "{line}");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One segment with payload on the iwarp-perf port.
#[derive(Debug)]
struct Segment {
    frame: u64,
    from_client: bool,
    seq: u64,
    len: u64,
    req: bool,
    rep: bool,
    ulpdu_lens: Vec<u64>,
    opcodes: Vec<u64>,
    fpduptrs: usize,
}

const FIELDS: [&str; 10] = [
    "frame.number",
    "tcp.srcport",
    "tcp.seq",
    "tcp.len",
    "iwarp_mpa.req",
    "iwarp_mpa.rep",
    "iwarp_mpa.ulpdulength",
    "iwarp_rdma.opcode",
    "iwarp_mpa.marker_fpduptr",
    "iwarp_ddp.tagged_flag",
];

fn number(field: &str) -> u64 {
    match field.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => field.parse(),
    }
    .unwrap_or_else(|_| panic!("not a number: {field:?}"))
}

fn segments(pcap: &[u8], port: u16) -> Vec<Segment> {
    tshark::decode(pcap, &format!("tcp.port == {port} && tcp.len > 0 && !tcp.analysis.retransmission && !tcp.analysis.spurious_retransmission"), &FIELDS)
        .into_iter()
        .map(|f| {
            let one = |i: usize| number(&f[i][0]);
            Segment {
                frame: one(0),
                from_client: one(1) != u64::from(port),
                seq: one(2),
                len: one(3),
                req: !f[4].is_empty(),
                rep: !f[5].is_empty(),
                ulpdu_lens: f[6].iter().map(|v| number(v)).collect(),
                opcodes: f[7].iter().map(|v| number(v)).collect(),
                fpduptrs: f[8].len(),
            }
        })
        .collect()
}

/// Whether an FPDU of either direction ends exactly where a marker falls
/// (a multiple of 512 octets after the first FPDU of that direction).
fn ends_on_marker(segs: &[Segment]) -> bool {
    [true, false].into_iter().any(|client| {
        let mut fpdus = segs
            .iter()
            .filter(|s| s.from_client == client && !s.req && !s.rep);
        let Some(first) = fpdus.next() else {
            return false;
        };
        let start = first.seq;
        std::iter::once(first)
            .chain(fpdus)
            .any(|s| (s.seq + s.len - start) % 512 == 0)
    })
}

/// Runs one iwarp-perf client under capture; returns the capture.
fn run(perf: &Path, op: &str, markers: bool, mss: u32) -> (Vec<u8>, u16) {
    let port = free_port();
    let cap = LiveCapture::start(port);
    let server = Server::start(perf, port);
    let mut cmd = Command::new(perf);
    cmd.args(["client", &format!("127.0.0.1:{port}"), "--op", op])
        .args(["--size", &SIZE.to_string(), "--iters", &ITERS.to_string()])
        .args(["--depth", "1", "--aligned", "--mss", &mss.to_string()]);
    if markers {
        cmd.arg("--markers");
    }
    let out = cmd.output().expect("run iwarp-perf client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "iwarp-perf {op} markers={markers}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("data check: OK"), "{stdout}");
    drop(server);
    (cap.finish(), port)
}

/// How many runs are made when the kernel's segmentation spoils them (see
/// [`check`]).
const MERGED_TRIES: usize = 3;

fn check(perf: &Path, op: &str, markers: bool) {
    let what = format!("{op}, markers {markers}");
    let mut tries = MSS.iter();
    let mut merged = 0;
    let mut mss = MSS[0];
    let (pcap, segs) = loop {
        if merged == 0 {
            mss = *tries.next().unwrap_or_else(|| {
                panic!("{what}: every MSS tried gives an FPDU ending on a marker")
            });
        }
        let (pcap, port) = run(perf, op, markers, mss);
        let segs = segments(&pcap, port);
        if markers && ends_on_marker(&segs) {
            eprintln!("{what}: MSS {mss} gives an FPDU ending on a marker; next");
            merged = 0;
            continue;
        }
        // Aligned mode writes each FPDU once TCP sent all before it, but
        // a loaded kernel may still put two in one segment (a retransmit,
        // say), which the dissector cannot follow: such a run is tried
        // again, a few times, before the checks below fail it.
        let many = segs.iter().skip(2).find(|s| s.ulpdu_lens.len() > 1);
        if let (Some(s), true) = (many, merged + 1 < MERGED_TRIES) {
            eprintln!(
                "{what}: frame {} holds {} FPDUs; again",
                s.frame,
                s.ulpdu_lens.len()
            );
            merged += 1;
            continue;
        }
        break (pcap, segs);
    };

    // The Request, the Reply, and then one FPDU per segment, each decoded
    // down to RDMAP.
    assert!(segs[0].req && segs[0].from_client, "{what}: {:?}", segs[0]);
    assert!(segs[1].rep && !segs[1].from_client, "{what}: {:?}", segs[1]);
    let fpdus = &segs[2..];
    for s in fpdus {
        assert_eq!(s.ulpdu_lens.len(), 1, "{what}: frame {} {s:?}", s.frame);
        assert_eq!(s.opcodes.len(), 1, "{what}: frame {} {s:?}", s.frame);
        // Markers in both directions or in none (the server mirrors the M
        // bit); every FPDU of more than 512 octets holds one.
        if markers && s.len > 512 {
            assert!(s.fpduptrs > 0, "{what}: frame {} no marker", s.frame);
        }
        if !markers {
            assert_eq!(s.fpduptrs, 0, "{what}: frame {}", s.frame);
        }
    }
    // The Request and Reply as sent: our M bit, C on, Rev 2.
    let frames = tshark::decode(
        &pcap,
        "iwarp_mpa.req || iwarp_mpa.rep",
        &[
            "iwarp_mpa.marker_flag",
            "iwarp_mpa.crc_flag",
            "iwarp_mpa.rej_flag",
            "iwarp_mpa.rev",
        ],
    );
    let m = if markers { "1" } else { "0" };
    for f in &frames {
        let flat: Vec<&str> = f.iter().map(|v| v[0].as_str()).collect();
        assert_eq!(flat, [m, "1", "0", "2"], "{what}");
    }

    // Every CRC good.
    let text = tshark::verbose(&pcap, "iwarp_mpa");
    assert_eq!(
        text.matches("(Good CRC32)").count(),
        fpdus.len(),
        "{what}: every FPDU has a good CRC"
    );
    assert!(!text.contains("Bad CRC32"), "{what}");

    // The data adds up: RDMAP opcodes 0 Write, 1 Read Request, 2 Read
    // Response, 3 Send; DDP headers of 14 (tagged) and 18 (untagged)
    // octets.
    let payload = |from_client: bool, opcode: u64, header: u64| -> (u64, usize) {
        let mut n = 0;
        let mut total = 0;
        for s in fpdus
            .iter()
            .filter(|s| s.from_client == from_client && s.opcodes[0] == opcode)
        {
            n += 1;
            total += s.ulpdu_lens[0] - header;
        }
        (total, n)
    };
    let data = SIZE * ITERS;
    match op {
        "send" => assert_eq!(payload(true, 3, 18).0, data, "{what}"),
        // The RTR is a zero-length Write too.
        "write" => assert_eq!(payload(true, 0, 14).0, data, "{what}"),
        "read" => {
            assert_eq!(payload(false, 2, 14).0, data, "{what}");
            assert_eq!(payload(true, 1, 18 + 28).1, ITERS as usize, "{what}");
        }
        _ => unreachable!(),
    }

    // Nothing malformed; no warning beyond the two this RFC 5044-era
    // dissector gives every RFC 6581 frame (docs/wire.md).
    for info in tshark::expert_infos(&pcap) {
        assert!(!info.contains("alformed"), "{what}: {info}");
        assert!(!info.contains("Unreassembled"), "{what}: {info}");
        for message in info.split('\t').nth(2).unwrap_or("").split(',') {
            assert!(
                !message.contains("RFC 5044")
                    || message.contains("Res field")
                    || message.contains("Rev field"),
                "{what}: {info}"
            );
        }
    }
}

/// One run per operation, with and without markers. Captures on `lo` are
/// best not run beside each other: `.config/nextest.toml` puts these tests
/// in one group that runs them one at a time.
fn capture_decodes(op: &str, markers: bool) {
    check(&cargo_bin("sdp-tools", "iwarp-perf"), op, markers);
}

#[test]
fn iwarp_perf_capture_decodes_send() {
    capture_decodes("send", false);
}

#[test]
fn iwarp_perf_capture_decodes_write() {
    capture_decodes("write", false);
}

#[test]
fn iwarp_perf_capture_decodes_read() {
    capture_decodes("read", false);
}

#[test]
fn iwarp_perf_capture_decodes_send_with_markers() {
    capture_decodes("send", true);
}

#[test]
fn iwarp_perf_capture_decodes_write_with_markers() {
    capture_decodes("write", true);
}

#[test]
fn iwarp_perf_capture_decodes_read_with_markers() {
    capture_decodes("read", true);
}
