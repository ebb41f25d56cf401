//! Two-endpoint tests of Zcopy and the Flow Control Modes (draft §9.2–§9.5,
//! §11, §12). Every work request of both sides is checked against Figure
//! 25 and every received message against its Accept columns (see
//! `testing`), on top of the §10.5 credit checks.

use super::{CloseReason, Config, FlowControlMode, Pipelining, ZcopyStats};
use crate::testing::{Pair, ZcopyUse};

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

/// Runs both applications until each read what the other wrote; asserts
/// the streams are intact and nobody closed.
fn transfer(pair: &mut Pair, a: u64, b: u64, steps: u64) {
    pair.apps[0].to_write = a;
    pair.apps[1].to_write = b;
    let done = pair.run(steps, |p| p.apps[0].read == b && p.apps[1].read == a);
    // The last completions reach the Data Source.
    pair.run(100_000, |p| !crate::testing::Transport::busy(&p.transport));
    for side in 0..2 {
        assert_eq!(
            pair.conns[side].close_reason(),
            None::<&CloseReason>,
            "side {side}"
        );
        assert!(
            pair.apps[side].errors.is_empty(),
            "{:?}",
            pair.apps[side].errors
        );
    }
    assert!(
        done,
        "stuck: read {} / {b} and {} / {a}; {:?} {:?}",
        pair.apps[0].read,
        pair.apps[1].read,
        pair.conns[0].zcopy_state(),
        pair.conns[1].zcopy_state()
    );
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
    assert_eq!(pair.apps[0].read_hash, pair.apps[1].write_hash);
}

fn sender() -> ZcopyUse {
    ZcopyUse {
        send_chance: 100,
        send_max: 40_000,
        ..ZcopyUse::default()
    }
}

fn receiver() -> ZcopyUse {
    ZcopyUse {
        post_chance: 50,
        post_max: 30_000,
        ..ZcopyUse::default()
    }
}

#[test]
fn read_zcopy_in_combined_mode() {
    let mut pair = Pair::new(&zconfig(), &zconfig(), 1);
    pair.apps[0].zcopy = sender();
    pair.apps[1].zcopy = receiver();
    transfer(&mut pair, 600_000, 0, 2_000_000);
    let s0 = pair.conns[0].zcopy_stats();
    let s1 = pair.conns[1].zcopy_stats();
    assert!(s0.src_avails > 0 && s0.read_zcopy_sent > 0, "{s0:?}");
    assert_eq!(s0.read_zcopy_sent, s1.read_zcopy_received);
    assert_eq!(s0.write_zcopy_sent, 0);
    assert_eq!(pair.conns[0].send_mode(), FlowControlMode::Combined);
    assert!(pair.apps[1].seen[2] > 0, "{:?}", pair.apps[1].seen);
    assert!(pair.works_checked > 0 && pair.accepts_checked > 0);
}

#[test]
fn src_avail_forced_to_bcopy_without_read_zcopy() {
    // The default Data Sink answers every SrcAvail with SendSm (§9.5.2.1).
    let b = Config {
        read_zcopy: false,
        ..zconfig()
    };
    let mut pair = Pair::new(&zconfig(), &b, 2);
    pair.apps[0].zcopy = sender();
    transfer(&mut pair, 300_000, 0, 2_000_000);
    let s0 = pair.conns[0].zcopy_stats();
    let s1 = pair.conns[1].zcopy_stats();
    assert!(s0.src_avails > 0, "{s0:?}");
    assert_eq!(s1.send_sms, s0.src_avails);
    assert_eq!(s0.read_zcopy_sent, 0);
}

#[test]
fn write_zcopy_in_pipelined_mode() {
    let a = Config {
        pipelining: Pipelining::Always,
        ..zconfig()
    };
    let mut pair = Pair::new(&a, &zconfig(), 3);
    pair.apps[0].zcopy = sender();
    pair.apps[1].zcopy = ZcopyUse {
        post_chance: 90,
        post_max: 60_000,
        ..ZcopyUse::default()
    };
    transfer(&mut pair, 800_000, 0, 3_000_000);
    let s0 = pair.conns[0].zcopy_stats();
    let s1 = pair.conns[1].zcopy_stats();
    assert_eq!(pair.conns[0].send_mode(), FlowControlMode::Pipelined);
    assert_eq!(pair.conns[1].recv_mode(), FlowControlMode::Pipelined);
    assert!(s1.sink_avails > 0, "{s1:?}");
    assert!(s0.write_zcopy_sent > 0, "{s0:?}");
    assert_eq!(s0.write_zcopy_sent, s1.write_zcopy_received);
}

#[test]
fn both_peers_send_large_buffers_with_no_receive_posted() {
    // The crossing-SrcAvail deadlock of §9.2: each Data Sink sees a
    // SrcAvail, has no receive posted and a SrcAvail of its own out.
    let mut pair = Pair::new(&zconfig(), &zconfig(), 4);
    pair.apps[0].zcopy = sender();
    pair.apps[1].zcopy = sender();
    transfer(&mut pair, 400_000, 400_000, 3_000_000);
    assert!(pair.conns[0].zcopy_stats().send_sms > 0);
    assert!(pair.conns[1].zcopy_stats().send_sms > 0);
}

#[test]
fn every_mode_transition_both_ways() {
    use FlowControlMode::*;
    let mut pair = Pair::new(&zconfig(), &zconfig(), 5);
    pair.apps[0].zcopy = sender();
    pair.apps[1].zcopy = receiver();
    pair.apps[0].to_write = u64::MAX / 2;
    // Combined → Pipelined → Combined → Buffered → Combined, with data
    // flowing all along.
    let steps: [(usize, bool, FlowControlMode); 4] = [
        (0, true, Pipelined),
        (0, true, Combined),
        (0, true, Buffered),
        (1, false, Combined),
    ];
    for (side, send, mode) in steps {
        let start = pair.apps[1].read;
        let r = if send {
            pair.conns[side].set_send_mode(mode)
        } else {
            pair.conns[side].set_recv_mode(mode)
        };
        assert_eq!(r, Ok(()));
        let ok = pair.run(2_000_000, |p| {
            p.conns[0].send_mode() == mode
                && p.conns[1].recv_mode() == mode
                && p.apps[1].read > start + 100_000
        });
        assert!(
            ok,
            "to {mode:?}: {:?} {:?}",
            pair.conns[0].send_mode(),
            pair.conns[1].recv_mode()
        );
        assert_eq!(pair.conns[0].close_reason(), None);
        assert_eq!(pair.conns[1].close_reason(), None);
    }
    // Not in Figure 26: Buffered → Pipelined, and the Mode Slave asking.
    assert!(pair.conns[1].set_send_mode(Buffered).is_ok());
    assert!(pair.conns[0].set_recv_mode(Combined).is_err());
    assert!(pair.conns[0].zcopy_stats().mode_changes >= 3);
}

/// Randomized operation sequences: Bcopy and Zcopy sends, posted and
/// plain receives, MSG_WAITALL, send deadlines and signals that cancel
/// SrcAvails (§9.5.4), receive deadlines that cancel SinkAvails (§9.5.5),
/// Mode changes asked by the applications at random and Pipelined Mode
/// entered and left on REQ_PIPE hints — in both directions, 100 000 steps
/// each, the byte streams intact. Every work request is checked against Figure 25 and
/// the two sides' §9.5.1 counters against each other.
#[test]
fn randomized_100k_steps_keep_the_streams_intact() {
    let mut total = ZcopyStats::default();
    let (mut interrupts, mut cut) = (0, 0);
    for seed in 0..4u64 {
        let a = Config {
            pipelining: if seed % 2 == 0 {
                Pipelining::OnRequest
            } else {
                Pipelining::Never
            },
            req_pipe: true,
            // Half the runs wait for SinkAvails in a streak.
            sink_avail_wait: std::time::Duration::from_micros(if seed < 2 { 0 } else { 500 }),
            ..zconfig()
        };
        let mut pair = Pair::new(&a, &a, 100 + seed);
        for side in 0..2 {
            pair.apps[side].zcopy = ZcopyUse {
                send_chance: 60,
                send_max: 20_000,
                send_deadline_us: 3_000,
                post_chance: 30,
                post_max: 20_000,
                waitall_chance: 20,
                post_deadline_us: 3_000,
                mode_chance: 2,
                interrupt_chance: 1,
            };
            pair.apps[side].to_write = u64::MAX / 2;
        }
        let mut steps = 0;
        while steps < 100_000 && pair.step() {
            steps += 1;
        }
        assert_eq!(
            steps,
            100_000,
            "seed {seed}: nothing left to do: {:?} {:?}",
            pair.conns[0].zcopy_state(),
            pair.conns[1].zcopy_state(),
        );
        for side in 0..2 {
            assert_eq!(
                pair.conns[side].close_reason(),
                None,
                "seed {seed} side {side}; peer: {:?}",
                pair.conns[1 - side].close_reason()
            );
            assert!(pair.apps[side].errors.is_empty());
        }
        // Stop writing and let everything arrive.
        for side in 0..2 {
            pair.apps[side].to_write = pair.apps[side].written;
            pair.apps[side].zcopy.send_chance = 0;
            pair.apps[side].zcopy.mode_chance = 0;
        }
        let done = pair.run(2_000_000, |p| {
            p.apps[0].zsends_done()
                && p.apps[1].zsends_done()
                && p.apps[1].read == p.apps[0].written
                && p.apps[0].read == p.apps[1].written
        });
        assert!(
            done,
            "seed {seed}: {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            pair.apps[0].seen,
            pair.apps[1].seen,
            pair.conns[0].zcopy_state(),
            pair.conns[1].zcopy_state(),
            (pair.conns[0].send_mode(), pair.conns[0].recv_mode()),
            (pair.conns[1].send_mode(), pair.conns[1].recv_mode()),
            (
                pair.apps[0].written,
                pair.apps[0].read,
                pair.apps[0].zsends_done()
            ),
            (
                pair.apps[1].written,
                pair.apps[1].read,
                pair.apps[1].zsends_done()
            ),
        );
        assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        assert_eq!(pair.apps[0].read_hash, pair.apps[1].write_hash);
        for side in 0..2 {
            interrupts += pair.apps[side].interrupts;
            cut += pair.apps[side].seen[1];
            let s = pair.conns[side].zcopy_stats();
            total.src_avails += s.src_avails;
            total.sink_avails += s.sink_avails;
            total.cancels += s.cancels;
            total.mode_changes += s.mode_changes;
            total.read_zcopy_sent += s.read_zcopy_sent;
            total.write_zcopy_sent += s.write_zcopy_sent;
            total.send_sms += s.send_sms;
        }
    }
    // Every mechanism was in the mix.
    assert!(
        total.src_avails > 0
            && total.sink_avails > 0
            && total.cancels > 0
            && total.mode_changes > 0
            && total.read_zcopy_sent > 0
            && total.write_zcopy_sent > 0
            && total.send_sms > 0,
        "{total:?}"
    );
    // Sends were interrupted, and some of them cut the stream (§9.5.4).
    assert!(interrupts > 0 && cut > 0, "{interrupts} {cut}");
}
