//! Zcopy scenarios with the order of events scripted message by message
//! (draft §9.4, §9.5.1, §9.5.4, §9.5.5, §10.6.1, §11.3): every work
//! request is still checked against Figure 25 and §10.5 (see `testing`).

use super::tests::{assert_violation, message};
use super::{Completion, Config, FlowControlMode, Pipelining, RecvFlags, SendFlags};
use crate::testing::{pattern, Pair, Transport};
use crate::verbs::{RdmaOp, RecvId, SendId, Work};
use crate::wire::{Body, Flags, SinkAvailRepr};

fn zconfig() -> Config {
    Config {
        bufs: 8,
        buf_size: 1024,
        desired_remote_buf_size: 1024,
        send_buffer: 16 * 1024,
        bcopy_threshold: 2048,
        read_zcopy: true,
        write_zcopy: true,
        max_adverts: 4,
        ..Config::default()
    }
}

/// Side 0 → side 1 in Pipelined Mode (side 0's policy), nothing on the
/// wire.
fn pipelined(seed: u64) -> Pair {
    pipelined_with(&zconfig(), &zconfig(), seed)
}

/// [`pipelined`] with side 0's and side 1's configurations (side 0's
/// pipelining set to Always).
fn pipelined_with(a: &Config, b: &Config, seed: u64) -> Pair {
    let a = Config {
        pipelining: Pipelining::Always,
        ..a.clone()
    };
    let mut pair = Pair::new(&a, b, seed);
    let ok = pair.run(100_000, |p| {
        p.conns[0].send_mode() == FlowControlMode::Pipelined
            && p.conns[1].recv_mode() == FlowControlMode::Pipelined
            && !Transport::busy(&p.transport)
    });
    assert!(ok);
    quiet(&mut pair);
    pair
}

/// Delivers and completes everything in flight.
fn quiet(pair: &mut Pair) {
    while Transport::busy(&pair.transport) {
        pair.deliver_all(0);
        pair.deliver_all(1);
        pair.complete_delivered(0);
        pair.complete_delivered(1);
    }
}

/// `n` bytes of side `side`'s stream by `send` (Bcopy).
fn send_bytes(pair: &mut Pair, side: usize, n: usize) {
    let mut b = vec![0; n];
    pattern(pair.apps[side].seed, pair.apps[side].written, &mut b);
    assert_eq!(pair.conns[side].send(n, SendFlags::EMPTY), Ok(n));
    pair.stage(side, &b);
    pair.drain();
}

/// `n` bytes of side `side`'s stream as one Zcopy send buffer.
fn send_zcopy(pair: &mut Pair, side: usize, n: usize) -> SendId {
    send_zcopy_until(pair, side, n, None)
}

/// [`send_zcopy`] with a deadline.
fn send_zcopy_until(
    pair: &mut Pair,
    side: usize,
    n: usize,
    deadline: Option<std::time::Instant>,
) -> SendId {
    let mut b = vec![0; n];
    pattern(pair.apps[side].seed, pair.apps[side].written, &mut b);
    let id = pair.conns[side]
        .send_zcopy(n as u64, deadline, pair.now)
        .unwrap();
    pair.stage(side, &b);
    pair.drain();
    id
}

fn post(pair: &mut Pair, side: usize, len: u32) -> RecvId {
    let id = pair.conns[side]
        .post_recv(len, RecvFlags::EMPTY, None)
        .unwrap();
    pair.drain();
    id
}

/// Side `side` reads `n` bytes with `recv`; they must be the peer's next.
fn read_bytes(pair: &mut Pair, side: usize, n: usize) {
    let mut got = vec![0; n];
    assert_eq!(pair.conns[side].recv(&mut got, RecvFlags::EMPTY), Ok(n));
    let mut want = vec![0; n];
    pattern(pair.apps[1 - side].seed, pair.apps[side].read, &mut want);
    assert_eq!(got, want);
    pair.apps[side].read += n as u64;
    pair.drain();
}

/// Side `side`'s completed buffer `id` holds the peer's next `n` bytes.
fn placed(pair: &mut Pair, side: usize, id: RecvId, n: u32) {
    let mem = pair.transport.take_recv_memory(side, id).unwrap();
    let mut want = vec![0; n as usize];
    pattern(pair.apps[1 - side].seed, pair.apps[side].read, &mut want);
    assert_eq!(&mem[..n as usize], &want[..]);
    pair.apps[side].read += u64::from(n);
}

fn completions(pair: &mut Pair, side: usize) -> Vec<Completion> {
    let mut v = Vec::new();
    while let Some(c) = pair.conns[side].poll_completion() {
        v.push(c);
    }
    v
}

/// The STag a "SinkAvail stag N ..." or "SrcAvail stag N ..." line names.
fn stag(line: &str) -> u32 {
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn no_close(pair: &Pair) {
    assert_eq!(pair.conns[0].close_reason(), None);
    assert_eq!(pair.conns[1].close_reason(), None);
}

/// §9.5.1's example: "if PotentialNonDiscards=2 and the Data Source has
/// three SinkAvail advertisements, all with NonDiscards=0, then the first
/// two advertisements are discarded as stale and RDMA is initiated on the
/// third." The two Data Messages that made them stale complete the first
/// two buffers with their payload (one message each, step 1).
#[test]
fn stale_sink_avail_worked_example() {
    let mut pair = pipelined(41);
    // Step 3: two payload messages, PotentialNonDiscards 2.
    send_bytes(&mut pair, 0, 100);
    send_bytes(&mut pair, 0, 100);
    assert_eq!(pair.on_wire(0), ["Data 100", "Data 100"]);
    assert_eq!(pair.conns[0].zcopy_state().potential_non_discards, 2);
    // The Data Sink has not seen them: three SinkAvails, NonDiscards 0.
    let r: Vec<RecvId> = (0..3).map(|_| post(&mut pair, 1, 3000)).collect();
    let sinks = pair.on_wire(1);
    assert_eq!(sinks.len(), 3, "{sinks:?}");
    for s in &sinks {
        assert!(
            s.starts_with("SinkAvail") && s.ends_with("nd 0 payload 0"),
            "{s}"
        );
    }
    // Step 4 for each, in order: two discards, the third kept.
    let expect = [(0, 1), (0, 0), (1, 0)];
    for (sink_in, pnd) in expect {
        assert!(pair.deliver_next(1));
        let z = pair.conns[0].zcopy_state();
        assert_eq!((z.sink_in, z.potential_non_discards), (sink_in, pnd));
    }
    // RDMA on the third.
    let id = send_zcopy(&mut pair, 0, 3000);
    assert_eq!(
        pair.on_wire(0),
        [
            "Data 100".to_string(),
            "Data 100".to_string(),
            format!("Write stag {} 3000", stag(&sinks[2])),
        ]
    );
    quiet(&mut pair);
    no_close(&pair);
    // Each Data Message completed one advertised buffer and did not count
    // in NonDiscards.
    assert_eq!(pair.conns[1].zcopy_state().non_discards, 0);
    let got = completions(&mut pair, 1);
    let copied = |id| Completion::Received {
        id,
        placed: 0,
        copy: 100,
    };
    assert_eq!(got, [copied(r[0]), copied(r[1])]);
    read_bytes(&mut pair, 1, 200);
    let got = completions(&mut pair, 1);
    assert_eq!(
        got,
        [Completion::Received {
            id: r[2],
            placed: 3000,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r[2], 3000);
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: 3000,
            zcopy: 3000
        }]
    );
}

/// §9.5.5 with an RDMA Write In-Process: the Write completes and its
/// RdmaWrCompl reaches the Data Sink before the SinkCancelAck that
/// discards the SinkAvail not yet used.
#[test]
fn sink_avail_cancel_while_rdma_write_in_process() {
    let mut pair = pipelined(42);
    let r0 = post(&mut pair, 1, 3000);
    let r1 = post(&mut pair, 1, 3000);
    let sinks = pair.on_wire(1);
    assert_eq!(sinks.len(), 2);
    pair.deliver_all(1);
    assert_eq!(pair.conns[0].zcopy_state().sink_in, 2);
    let id = send_zcopy(&mut pair, 0, 3000);
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 3000", stag(&sinks[0]))]
    );
    // The read times out: every advertisement is canceled.
    assert!(pair.conns[1].cancel_recv(r0));
    pair.drain();
    assert_eq!(pair.on_wire(1), ["SinkAvailCancel"]);
    pair.deliver_all(1);
    // Step 1: no new RDMA Write; nothing answers before the Write is done.
    assert_eq!(pair.conns[0].zcopy_state().sink_in, 0);
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 3000", stag(&sinks[0]))]
    );
    pair.deliver_next(0);
    pair.complete_delivered(0);
    // Step 2, then exactly one SinkCancelAck.
    assert_eq!(
        pair.on_wire(0),
        [
            "RdmaWrCompl(RdmaWrComplRepr { len: 3000 })",
            "SinkCancelAck"
        ]
    );
    assert_eq!(
        pair.sink_cancels[0],
        crate::testing::SinkCancels {
            received: 1,
            acked: 1
        }
    );
    quiet(&mut pair);
    no_close(&pair);
    let got = completions(&mut pair, 1);
    assert_eq!(
        got,
        [
            Completion::Received {
                id: r1,
                placed: 0,
                copy: 0
            },
            Completion::Received {
                id: r0,
                placed: 3000,
                copy: 0
            },
        ]
    );
    placed(&mut pair, 1, r0, 3000);
    assert_eq!(pair.conns[1].zcopy_state().sink_out, 0);
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: 3000,
            zcopy: 3000
        }]
    );
}

/// §9.5.4 with an RDMA Read In-Process: the Data Sink holds MSeqAck below
/// the SrcAvailCancel's MSeq until the Read is done, sends its
/// RdmaRdCompl, then one SendSm that acknowledges the cancel; the Data
/// Source's stream ends where the Read stopped.
#[test]
fn src_avail_cancel_while_rdma_read_in_process() {
    let mut pair = Pair::new(&zconfig(), &zconfig(), 43);
    quiet(&mut pair);
    let start = pair.now;
    let id = send_zcopy_until(
        &mut pair,
        0,
        10_000,
        Some(start + std::time::Duration::from_millis(1)),
    );
    let wire = pair.on_wire(0);
    assert_eq!(wire.len(), 1);
    assert!(wire[0].starts_with("SrcAvail") && wire[0].contains("len 10000"));
    let payload: usize = wire[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(payload > 0, "Combined Mode: payload in the SrcAvail");
    pair.deliver_all(0);
    read_bytes(&mut pair, 1, payload);
    let r = post(&mut pair, 1, 4000);
    assert_eq!(
        pair.on_wire(1),
        [format!("Read stag {} 4000", stag(&wire[0]))]
    );
    // The send times out while the Read is In-Process.
    pair.now = start + std::time::Duration::from_millis(2);
    pair.conns[0].handle_timeout(pair.now);
    pair.drain();
    assert_eq!(pair.on_wire(0), ["SrcAvailCancel"]);
    assert!(pair.conns[0].zcopy_state().src_cancel_sent);
    let cancel = pair.conns[0].credit_state().lsseq;
    pair.deliver_all(0);
    // A message the Data Sink sends meanwhile: MSeqAck held below it.
    send_bytes(&mut pair, 1, 10);
    let seq = pair.on_wire_seq(1);
    assert_eq!(pair.on_wire(1)[1], "Data 10");
    assert_eq!(seq[1].1, cancel.wrapping_sub(1));
    pair.deliver_all(1);
    pair.complete_delivered(1);
    assert_eq!(
        pair.on_wire(1),
        ["RdmaRdCompl(RdmaRdComplRepr { len: 4000 })", "SendSm"]
    );
    assert!(pair.on_wire_seq(1)[1].1 >= cancel);
    quiet(&mut pair);
    // The SendSm Processed the cancel: SrcAvails may go again.
    assert!(!pair.conns[0].zcopy_state().src_cancel_sent);
    no_close(&pair);
    let cut = payload as u32 + 4000;
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: u64::from(cut),
            zcopy: 4000
        }]
    );
    assert_eq!(pair.conns[0].tx().accepted(), u64::from(cut));
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r,
            placed: 4000,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r, 4000);
    assert_eq!(pair.conns[1].zcopy_state().src_in, 0);
    // Nothing of the canceled rest follows; the stream goes on after it.
    send_bytes(&mut pair, 0, 50);
    quiet(&mut pair);
    read_bytes(&mut pair, 1, 50);
    no_close(&pair);
}

/// §9.4: the Data Sink's SinkAvail carries the Data Message of the other
/// direction; the Data Source fills the buffer with an RDMA Write.
#[test]
fn transaction_sink_avail_carries_payload() {
    let mut pair = pipelined(44);
    // Side 1 is the Data Sink of side 0's stream and has a command of its
    // own to send: both go in one SinkAvail.
    // (The command is handed while the buffer's registration is under
    // way, as when the application posts its receive and sends at once.)
    let r = pair.conns[1]
        .post_recv(3000, RecvFlags::EMPTY, None)
        .unwrap();
    let mut registered = Vec::new();
    while let Some(work) = pair.conns[1].poll_work() {
        let register = matches!(work, Work::Rdma(RdmaOp::Register { .. }));
        pair.transport.submit(1, &work, &[], &mut registered);
        if register {
            break;
        }
    }
    assert!(!registered.is_empty());
    let mut b = vec![0; 300];
    pattern(pair.apps[1].seed, 0, &mut b);
    assert_eq!(pair.conns[1].send(300, SendFlags::EMPTY), Ok(300));
    pair.stage(1, &b);
    for (side, event) in registered {
        pair.feed(side, event);
    }
    pair.drain();
    let wire = pair.on_wire(1);
    assert_eq!(wire.len(), 1, "{wire:?}");
    assert!(wire[0].starts_with("SinkAvail") && wire[0].ends_with("payload 300"));
    pair.deliver_all(1);
    read_bytes(&mut pair, 0, 300);
    // The reply fills the advertised buffer.
    let id = send_zcopy(&mut pair, 0, 2500);
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 2500", stag(&wire[0]))]
    );
    quiet(&mut pair);
    no_close(&pair);
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r,
            placed: 2500,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r, 2500);
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: 2500,
            zcopy: 2500
        }]
    );
    let s1 = pair.conns[1].zcopy_stats();
    assert_eq!((s1.sink_avails, s1.bcopy_sent), (1, 300));
}

/// §11.3: a SrcAvail and a SinkAvail cross. The Data Sink ignores the
/// SrcAvail (rule 2b), the Data Source treats it as discarded and uses
/// Write Zcopy (rules 1a, 1b), then advertises the rest by a new SrcAvail.
#[test]
fn crossing_src_avail_and_sink_avail() {
    let mut pair = pipelined(45);
    let id = send_zcopy(&mut pair, 0, 5000);
    let src = pair.on_wire(0);
    assert_eq!(src.len(), 1);
    assert!(src[0].starts_with("SrcAvail") && src[0].ends_with("len 5000 payload 0"));
    let r0 = post(&mut pair, 1, 3000);
    let sink = pair.on_wire(1);
    assert_eq!(sink.len(), 1);
    assert!(sink[0].starts_with("SinkAvail"));
    pair.deliver_all(0);
    assert_eq!(pair.conns[1].zcopy_state().src_in, 0, "rule 2b");
    pair.deliver_all(1);
    assert_eq!(pair.conns[0].zcopy_state().src_out, 0, "rule 1b");
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 3000", stag(&sink[0]))]
    );
    pair.deliver_next(0);
    pair.complete_delivered(0);
    let wire = pair.on_wire(0);
    assert_eq!(wire[0], "RdmaWrCompl(RdmaWrComplRepr { len: 3000 })");
    assert!(wire[1].starts_with("SrcAvail") && wire[1].ends_with("len 2000 payload 0"));
    assert_ne!(stag(&wire[1]), stag(&src[0]));
    pair.deliver_all(0);
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r0,
            placed: 3000,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r0, 3000);
    let r1 = post(&mut pair, 1, 2000);
    quiet(&mut pair);
    no_close(&pair);
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r1,
            placed: 2000,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r1, 2000);
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: 5000,
            zcopy: 5000
        }]
    );
}

/// §11.3 MaxAdverts: our SinkAvails stay within the peer's MaxAdverts; a
/// peer sending more than ours is a violation.
#[test]
fn max_adverts_limit() {
    let a = Config {
        pipelining: Pipelining::Always,
        max_adverts: 2,
        ..zconfig()
    };
    let mut pair = Pair::new(&a, &zconfig(), 46);
    pair.run(100_000, |p| {
        p.conns[1].recv_mode() == FlowControlMode::Pipelined && !Transport::busy(&p.transport)
    });
    for _ in 0..4 {
        post(&mut pair, 1, 3000);
    }
    assert_eq!(pair.on_wire(1).len(), 2, "{:?}", pair.on_wire(1));
    assert_eq!(pair.conns[1].zcopy_state().sink_out, 2);
    quiet(&mut pair);
    no_close(&pair);

    // Side 1 as Data Source in Pipelined Mode, MaxAdverts 4: a fifth
    // SinkAvail breaks §11.3.
    let b = Config {
        pipelining: Pipelining::Always,
        ..zconfig()
    };
    let mut pair = Pair::new(&zconfig(), &b, 47);
    pair.run(100_000, |p| {
        p.conns[1].send_mode() == FlowControlMode::Pipelined && !Transport::busy(&p.transport)
    });
    for i in 0..5u32 {
        let header = SinkAvailRepr {
            len: 3000,
            stag: 0x100 + i,
            va: 0,
            non_discards: 0,
        };
        let m = message(
            &pair,
            Flags::EMPTY,
            Body::SinkAvail {
                header,
                payload: &[],
            },
        );
        pair.inject(1, &m, m.len()).unwrap();
        pair.drain();
        if i < 4 {
            assert_eq!(pair.conns[1].zcopy_state().sink_in, i as usize + 1);
            assert_eq!(pair.conns[1].close_reason(), None);
        }
    }
    assert_violation(pair.conns[1].close_reason().copied(), "§11.3");
}

/// §11.3 with stale SinkAvails: the Data Source holds MaxAdverts (4)
/// SinkAvails when it sends a small write by Bcopy; that Data Message
/// completes the Data Sink's first advertised buffer (§9.5.1 step 1), so
/// the Data Sink has three out and advertises its next posted buffer. The
/// Data Source discards the SinkAvail the Data Message made stale before it
/// counts the new one: four outstanding, no violation.
#[test]
fn a_stale_sink_avail_does_not_count_against_max_adverts() {
    let mut pair = pipelined(49);
    let r: Vec<RecvId> = (0..4).map(|_| post(&mut pair, 1, 3000)).collect();
    quiet(&mut pair);
    assert_eq!(pair.conns[0].zcopy_state().sink_in, 4);
    send_bytes(&mut pair, 0, 100);
    quiet(&mut pair);
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r[0],
            placed: 0,
            copy: 100
        }]
    );
    read_bytes(&mut pair, 1, 100);
    let next = post(&mut pair, 1, 3000);
    quiet(&mut pair);
    no_close(&pair);
    assert_eq!(pair.conns[1].zcopy_state().sink_out, 4);
    assert_eq!(pair.conns[0].zcopy_state().sink_in, 4);
    // The next Zcopy write goes into the oldest buffer still advertised.
    send_zcopy(&mut pair, 0, 3000);
    quiet(&mut pair);
    no_close(&pair);
    let got = completions(&mut pair, 1);
    assert_eq!(
        got,
        [Completion::Received {
            id: r[1],
            placed: 3000,
            copy: 0
        }]
    );
    placed(&mut pair, 1, r[1], 3000);
    let _ = next;
}

/// §10.6.1: both peers send ChRcvBuf at once. The Accepting Peer
/// disregards the Connecting Peer's; the Connecting Peer answers and then
/// sends its own again, which the Accepting Peer answers.
#[test]
fn ch_rcv_buf_conflict() {
    let mut pair = Pair::new(&zconfig(), &zconfig(), 48);
    quiet(&mut pair);
    assert_eq!(pair.conns[0].request_buf_size(2048), Ok(()));
    assert_eq!(pair.conns[1].request_buf_size(4096), Ok(()));
    // One unacknowledged request at a time.
    assert_eq!(
        pair.conns[0].request_buf_size(512),
        Err(crate::errno::Error::WouldBlock)
    );
    pair.drain();
    assert_eq!(pair.on_wire(0), ["ChRcvBuf(ChRcvBufRepr { des_sz: 2048 })"]);
    assert_eq!(pair.on_wire(1), ["ChRcvBuf(ChRcvBufRepr { des_sz: 4096 })"]);
    pair.deliver_all(0);
    // The Accepting Peer (side 1) disregards it.
    assert_eq!(pair.on_wire(1), ["ChRcvBuf(ChRcvBufRepr { des_sz: 4096 })"]);
    pair.deliver_all(1);
    // The Connecting Peer answers (its buffers stay 1024) and asks again.
    assert_eq!(
        pair.on_wire(0),
        [
            "ChRcvBufAck(ChRcvBufAckRepr { act_sz: 1024 })",
            "ChRcvBuf(ChRcvBufRepr { des_sz: 2048 })"
        ]
    );
    pair.deliver_all(0);
    assert_eq!(
        pair.on_wire(1),
        ["ChRcvBufAck(ChRcvBufAckRepr { act_sz: 1024 })"]
    );
    // The Accepting Peer asked for more and got the original size: no
    // further increases (§10.6).
    assert_eq!(
        pair.conns[1].request_buf_size(8192),
        Err(crate::errno::Error::InvalidInput)
    );
    pair.deliver_all(1);
    assert_eq!(pair.conns[0].peer_buf_size(), Some(1024));
    assert_eq!(pair.conns[0].request_buf_size(512), Ok(()));
    quiet(&mut pair);
    no_close(&pair);
    // The peer keeps its buffers: the answer is the original size.
    assert_eq!(pair.conns[0].peer_buf_size(), Some(1024));
    send_bytes(&mut pair, 0, 100);
    quiet(&mut pair);
    read_bytes(&mut pair, 1, 100);
    no_close(&pair);
}

/// §8.2.1 at the end of a Write Zcopy transfer (the `sdpcat -z both`
/// reset): the Data Sink closed its send half first and has a SinkAvail
/// out for its next read when the Data Source's DisConn arrives. The
/// DisConn cancels the SinkAvail and completes the buffer (unused); no
/// SinkAvailCancel goes, whose SinkCancelAck a peer that closed its socket
/// would never send — the read then waited until the LLP teardown and
/// reported a reset. Nothing at all goes once both DisConns are out.
#[test]
fn peer_disconn_completes_an_advertised_buffer_without_a_cancel() {
    let mut pair = pipelined(43);
    pair.conns[1].shutdown(super::Shutdown::Write).unwrap();
    pair.drain();
    assert_eq!(pair.on_wire(1), ["DisConn"]);
    quiet(&mut pair);
    let r = post(&mut pair, 1, 3000);
    let sink = pair.on_wire(1);
    assert_eq!(sink.len(), 1, "{sink:?}");
    assert!(sink[0].starts_with("SinkAvail"), "{sink:?}");
    // The SinkAvail reaches the Data Source after its DisConn went.
    pair.conns[0].shutdown(super::Shutdown::Write).unwrap();
    pair.drain();
    assert_eq!(pair.on_wire(0), ["DisConn"]);
    pair.deliver_all(1);
    pair.drain();
    assert_eq!(pair.on_wire(0), ["DisConn"]);
    pair.deliver_all(0);
    pair.drain();
    // Before: a SinkAvailCancel here.
    assert_eq!(pair.on_wire(1), Vec::<String>::new());
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r,
            placed: 0,
            copy: 0
        }]
    );
    let mut b = [0u8; 16];
    assert_eq!(pair.conns[1].recv(&mut b, RecvFlags::EMPTY), Ok(0));
    // A read posted now completes at once, unadvertised.
    let late = post(&mut pair, 1, 3000);
    assert_eq!(pair.on_wire(1), Vec::<String>::new());
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: late,
            placed: 0,
            copy: 0
        }]
    );
    assert!(pair.settle(100_000));
    for side in 0..2 {
        assert_eq!(
            pair.conns[side].close_reason(),
            Some(&super::CloseReason::Graceful),
            "side {side}"
        );
    }
}

/// A SinkAvailCancel that crossed the Data Source's DisConn is not
/// answered (the DisConn canceled the SinkAvails, §8.2.1); a SinkCancelAck
/// from a peer that answers anyway is accepted once.
#[test]
fn sink_avail_cancel_crossing_the_peer_disconn() {
    let mut pair = pipelined(44);
    let r = post(&mut pair, 1, 3000);
    pair.deliver_all(1);
    pair.complete_delivered(1);
    assert!(pair.conns[1].cancel_recv(r));
    pair.drain();
    assert_eq!(pair.on_wire(1), ["SinkAvailCancel"]);
    pair.conns[0].shutdown(super::Shutdown::Write).unwrap();
    pair.drain();
    assert_eq!(pair.on_wire(0), ["DisConn"]);
    quiet(&mut pair);
    // No SinkCancelAck, no violation; the buffer came back unused.
    no_close(&pair);
    assert_eq!(pair.conns[0].zcopy_state().sink_in, 0);
    assert_eq!(pair.conns[0].zcopy_stats().cancels, 0);
    assert_eq!(
        completions(&mut pair, 1),
        [Completion::Received {
            id: r,
            placed: 0,
            copy: 0
        }]
    );
    // Another implementation's SinkCancelAck after its DisConn.
    pair.check_non_discards = false;
    let ack = message(&pair, Flags::EMPTY, Body::SinkCancelAck);
    pair.inject(1, &ack, ack.len()).unwrap();
    pair.drain();
    no_close(&pair);
    // A second one is a violation.
    let ack = message(&pair, Flags::EMPTY, Body::SinkCancelAck);
    pair.inject(1, &ack, ack.len()).unwrap();
    pair.drain();
    assert_violation(pair.conns[1].close_reason().copied(), "§9.5.5");
}

/// §8.2.1, credits: once the peer's DisConn arrived and our own went, the
/// buffers our application frees by reading the last data are not
/// advertised — a credit update could reach a peer that closed its socket
/// after its DisConn was acknowledged (as a TCP sender may exit after
/// its last write) and be answered with a reset.
#[test]
fn no_credit_update_after_both_disconns() {
    let config = Config {
        bufs: 4,
        ..zconfig()
    };
    let mut pair = Pair::new(&config, &config, 45);
    pair.conns[1].shutdown(super::Shutdown::Write).unwrap();
    pair.drain();
    quiet(&mut pair);
    // Side 0 fills side 1's buffers, then closes.
    let mut sent = 0;
    while pair.conns[0].credit_state().send_credit >= 3 {
        send_bytes(&mut pair, 0, 1000);
        sent += 1000;
    }
    pair.conns[0].shutdown(super::Shutdown::Write).unwrap();
    pair.drain();
    pair.deliver_all(0);
    pair.drain();
    assert!(pair.conns[1].disconn_received() && pair.conns[1].disconn_sent());
    read_bytes(&mut pair, 1, sent);
    // Before: a credit update (the peer's credit had dropped to one).
    assert_eq!(pair.on_wire(1), Vec::<String>::new());
    assert!(!pair.conns[1].credit_state().must_update);
    let mut b = [0u8; 16];
    assert_eq!(pair.conns[1].recv(&mut b, RecvFlags::EMPTY), Ok(0));
}

/// §9.4's choice for the Data Source, Config::sink_avail_wait: once the
/// Data Sink posts ahead (a SinkAvail came), a Zcopy buffer with no
/// SinkAvail in hand sends nothing until the next SinkAvail, which it
/// then fills; a wait that runs out sends a SrcAvail and ends the streak.
#[test]
fn a_sink_streak_makes_the_source_wait_for_the_next_sink_avail() {
    let wait = std::time::Duration::from_millis(5);
    let a = Config {
        sink_avail_wait: wait,
        ..zconfig()
    };
    let mut pair = pipelined_with(&a, &zconfig(), 47);
    // No streak yet: the first buffer does not wait.
    let first = send_zcopy(&mut pair, 0, 3000);
    let wire = pair.on_wire(0);
    assert_eq!(wire.len(), 1);
    assert!(wire[0].starts_with("SrcAvail"), "{wire:?}");
    let r = post(&mut pair, 1, 3000);
    quiet(&mut pair);
    placed(&mut pair, 1, r, 3000);
    completions(&mut pair, 1);
    completions(&mut pair, 0);
    // A SinkAvail fills a buffer: the streak begins.
    let r = post(&mut pair, 1, 3000);
    let sinks = pair.on_wire(1);
    pair.deliver_all(1);
    let second = send_zcopy(&mut pair, 0, 3000);
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 3000", stag(&sinks[0]))]
    );
    quiet(&mut pair);
    placed(&mut pair, 1, r, 3000);
    completions(&mut pair, 1);
    // The next buffer waits: nothing on the wire, the timer armed.
    let third = send_zcopy(&mut pair, 0, 3000);
    assert!(pair.on_wire(0).is_empty());
    assert_eq!(pair.conns[0].poll_timeout(), Some(pair.now + wait));
    // The Data Sink posts: its SinkAvail is written into.
    let r = post(&mut pair, 1, 3000);
    let sinks = pair.on_wire(1);
    pair.deliver_all(1);
    pair.drain();
    assert_eq!(
        pair.on_wire(0),
        [format!("Write stag {} 3000", stag(&sinks[0]))]
    );
    quiet(&mut pair);
    placed(&mut pair, 1, r, 3000);
    completions(&mut pair, 1);
    // The next waits in vain: at the timer, a SrcAvail; no more waiting.
    let fourth = send_zcopy(&mut pair, 0, 3000);
    assert!(pair.on_wire(0).is_empty());
    pair.now += wait;
    pair.conns[0].handle_timeout(pair.now);
    pair.drain();
    let wire = pair.on_wire(0);
    assert_eq!(wire.len(), 1);
    assert!(wire[0].starts_with("SrcAvail"), "{wire:?}");
    let r = post(&mut pair, 1, 3000);
    quiet(&mut pair);
    placed(&mut pair, 1, r, 3000);
    completions(&mut pair, 1);
    assert_eq!(pair.conns[0].poll_timeout(), None);
    let sent: Vec<_> = completions(&mut pair, 0)
        .into_iter()
        .filter_map(|c| match c {
            Completion::Sent { id, zcopy, .. } => Some((id, zcopy)),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [(second, 3000), (third, 3000), (fourth, 3000)]);
    let _ = first;
    no_close(&pair);
}

/// A Data Sink that answers SrcAvails by SendSm (no Read Zcopy): after two
/// in a row, a Pipelined Mode Data Source sends its Zcopy buffers by Bcopy
/// without asking first, so the Data Sink may advertise again (§11.3 rule
/// 2a); 16 MiB later it asks once more.
#[test]
fn send_sms_in_a_row_skip_the_src_avail() {
    let b = Config {
        read_zcopy: false,
        write_zcopy: false,
        ..zconfig()
    };
    let mut pair = pipelined_with(&zconfig(), &b, 48);
    // Whether a 3000-byte buffer was asked for by SrcAvail.
    let buffer = |pair: &mut Pair| {
        let before = pair.conns[0].zcopy_stats().src_avails;
        send_zcopy(pair, 0, 3000);
        quiet(pair);
        let asked = pair.conns[0].zcopy_stats().src_avails > before;
        assert_eq!(pair.conns[1].bytes_readable(), 3000);
        read_bytes(pair, 1, 3000);
        quiet(pair);
        asked
    };
    let asked: Vec<bool> = (0..3).map(|_| buffer(&mut pair)).collect();
    assert_eq!(asked, [true, true, false]);

    // 16 MiB on, one more SrcAvail; refused again, then Bcopy.
    let skip = 16 << 20;
    let before = pair.conns[0].zcopy_stats().src_avails;
    for _ in 0..skip / 65536 {
        send_zcopy(&mut pair, 0, 65536);
        let mut left = 65536;
        while left > 0 {
            quiet(&mut pair);
            let n = pair.conns[1].bytes_readable() as usize;
            assert!(n > 0);
            read_bytes(&mut pair, 1, n);
            left -= n;
        }
    }
    assert_eq!(pair.conns[0].zcopy_stats().src_avails, before);
    let asked: Vec<bool> = (0..3).map(|_| buffer(&mut pair)).collect();
    assert_eq!(asked, [true, false, false]);
    assert_eq!(pair.conns[0].zcopy_stats().src_avails, 3);
    no_close(&pair);
}

/// A send buffer going by Bcopy (not larger than the Bcopy Threshold)
/// whose deadline passes while credits hold the rest back: what is not yet
/// in a Send leaves the stream, its completion says how much stayed, and
/// the next bytes follow those.
#[test]
fn a_bcopy_send_buffer_is_cut_at_its_deadline() {
    let config = Config {
        bcopy_threshold: u64::MAX,
        ..zconfig()
    };
    let mut pair = Pair::new(&config, &config, 49);
    let ok = pair.run(100_000, |p| !Transport::busy(&p.transport));
    assert!(ok);
    quiet(&mut pair);
    let start = pair.now;
    let id = send_zcopy_until(
        &mut pair,
        0,
        20_000,
        Some(start + std::time::Duration::from_millis(1)),
    );
    quiet(&mut pair);
    // The reader reads nothing: the credits (8 buffers) ran out.
    let kept = pair.conns[0].tx().sent();
    assert!(kept > 0 && kept < 20_000, "{kept}");
    assert_eq!(completions(&mut pair, 0), []);
    assert_eq!(
        pair.conns[0].poll_timeout(),
        Some(start + std::time::Duration::from_millis(1))
    );
    pair.now = start + std::time::Duration::from_millis(1);
    pair.conns[0].handle_timeout(pair.now);
    pair.drain();
    assert_eq!(
        completions(&mut pair, 0),
        [Completion::Sent {
            id,
            len: kept,
            zcopy: 0
        }]
    );
    // The stream goes on from there.
    pair.unstage(0, kept);
    send_bytes(&mut pair, 0, 100);
    let mut left = kept as usize + 100;
    while left > 0 {
        quiet(&mut pair);
        let n = pair.conns[1].bytes_readable() as usize;
        assert!(n > 0);
        read_bytes(&mut pair, 1, n);
        left -= n;
    }
    quiet(&mut pair);
    assert_eq!(pair.conns[1].bytes_readable(), 0);
    no_close(&pair);
}
