//! The same-host path of a connection (DESIGN §9; wire format in
//! [`crate::wire::local`]): when both ends run on one kernel, the Data
//! Source writes a large message's payload straight into a ring the Data
//! Sink offered, and sends only the LocalData header on the TCP
//! connection, after the bytes have landed. The receiving half reads the
//! bytes from its ring as it reads a Private Buffer.
//!
//! The two directions are independent. A receive half offers its ring once
//! it has received [`OFFER_AFTER`] bytes (a connection that moves little
//! never pays for one); the peer's send half checks the offer (the link
//! reads the token back) and from then on sends payloads
//! of [`LOCAL_MIN`] bytes or more as LocalData. Anything that goes wrong
//! on the sending side — the check fails, a write is refused — turns that
//! direction back to the wire for good, with the reason kept for
//! `sdp-stat`; the message in hand goes as a Data Message, so nothing is
//! lost.
//!
//! Which slot a LocalData uses is its count modulo the ring's slots, and
//! the ring has at least as many slots as the receiver has Private
//! Buffers. A LocalData holds its Private Buffer until its bytes are read,
//! and reads are in stream order, so the credit (§10) that lets the sender
//! reuse a slot proves the bytes in it were read.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use crate::verbs::PeerSlot;
use crate::wire::{LocalDataRepr, LocalOfferRepr};

/// Bytes a receive half takes in Data Messages before it offers its ring.
pub const OFFER_AFTER: u64 = 256 * 1024;

/// The smallest slot a ring offers: a LocalData carries up to a slot,
/// several Private Buffers' worth, so a bulk stream takes fewer messages.
pub const SLOT_MIN: u32 = 256 * 1024;

/// The smallest payload sent as LocalData: below it, a write into the
/// peer costs more than the bytes in the TCP stream.
pub const LOCAL_MIN: u64 = 16 * 1024;

/// How long a ring whose peer may still write into it outlives its
/// connection (an abortive end, a suspended connection): the peer writes
/// only right before it sends a LocalData, on a connection it believes
/// open; a reset reaches it long before this.
const QUARANTINE: Duration = Duration::from_secs(10);

/// Why a send half does not use the same-host path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalOff {
    /// Turned off here (`Config::local`).
    Disabled,
    /// The peer does not speak the extension, or has not offered yet.
    NotOffered,
    /// The token read back did not match: another host or another process.
    OtherHost,
    /// The peer's memory may not be touched (another user, a
    /// non-dumpable process): the errno.
    Refused(i32),
    /// The peer process is gone (`ESRCH`).
    Gone,
    /// The offer's ring does not fit our messages.
    BadOffer,
}

impl core::fmt::Display for LocalOff {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LocalOff::Disabled => f.write_str("off"),
            LocalOff::NotOffered => f.write_str("not offered"),
            LocalOff::OtherHost => f.write_str("other host"),
            LocalOff::Refused(e) => write!(f, "refused (errno {e})"),
            LocalOff::Gone => f.write_str("peer gone"),
            LocalOff::BadOffer => f.write_str("bad offer"),
        }
    }
}

/// [`crate::conn::Conn::local_state`] as one number for the counters:
/// bit 16 set while our ring is offered; the low bits 1 while the send
/// half writes into the peer, else why not: 0 not offered, 2 turned off,
/// 3 another host, 4 the peer gone, 5 a bad offer, 0x100 + errno refused.
pub fn code((send, ring): (Result<(), LocalOff>, bool)) -> u64 {
    let send = match send {
        Ok(()) => 1,
        Err(LocalOff::NotOffered) => 0,
        Err(LocalOff::Disabled) => 2,
        Err(LocalOff::OtherHost) => 3,
        Err(LocalOff::Gone) => 4,
        Err(LocalOff::BadOffer) => 5,
        Err(LocalOff::Refused(e)) => 0x100 + u64::from(e.unsigned_abs() & 0xff),
    };
    send | (u64::from(ring) << 16)
}

/// The send half's state from [`code`]'s number.
pub fn decode(code: u64) -> (Result<(), LocalOff>, bool) {
    let send = match code & 0xffff {
        1 => Ok(()),
        2 => Err(LocalOff::Disabled),
        3 => Err(LocalOff::OtherHost),
        4 => Err(LocalOff::Gone),
        5 => Err(LocalOff::BadOffer),
        n if n >= 0x100 => Err(LocalOff::Refused((n - 0x100) as i32)),
        _ => Err(LocalOff::NotOffered),
    };
    (send, code & (1 << 16) != 0)
}

/// Bytes in front of slot 0: the token sits in the last 4 of them, where
/// no payload ever goes.
pub const GUARD: usize = 64;

/// A transparent huge page: slots start on one, so that the kernel may
/// back them by huge pages and the peer's `process_vm_writev` pins one
/// page where it would pin 512.
const HUGE_PAGE: usize = 2 << 20;

/// The send half's use of the peer's ring. Boxed where it holds an
/// offer: most connections never get one, and each byte of a connection
/// counts (issue 17's 16 KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendPath {
    /// No offer yet (or the peer does not speak the extension).
    Wire(LocalOff),
    /// An offer to check before the first write.
    Check(Box<LocalOfferRepr>),
    /// Checked: LocalData go to the slots in turn.
    On(Box<Writing>),
}

/// A send half writing into the peer's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Writing {
    pub offer: LocalOfferRepr,
    /// LocalData sent so far.
    pub sent: u32,
}

/// The same-host state of one connection (the receive half's is in its
/// [`Ring`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Local {
    /// Both ends speak the extension (Hello and HelloAck bits).
    pub both: bool,
    /// A `fork` came (see [`Ring::revoke`]): this receive half offers no
    /// ring, now or later, in either process.
    pub forked: bool,
    pub send: SendPath,
}

impl Local {
    pub fn new(enabled: bool) -> Local {
        let off = if enabled {
            LocalOff::NotOffered
        } else {
            LocalOff::Disabled
        };
        Local {
            both: false,
            forked: false,
            send: SendPath::Wire(off),
        }
    }

    /// The size of the peer's slots while LocalData go there.
    pub fn slot_size(&self) -> Option<u64> {
        match &self.send {
            SendPath::On(w) => Some(u64::from(w.offer.slot_size)),
            _ => None,
        }
    }

    /// The slot for a payload of `len` bytes if it goes as LocalData.
    pub fn next_slot(&self, len: u64) -> Option<(LocalDataRepr, PeerSlot)> {
        let SendPath::On(w) = &self.send else {
            return None;
        };
        let Writing { offer, sent } = **w;
        if len < LOCAL_MIN || len > u64::from(offer.slot_size) {
            return None;
        }
        let slot = sent % u32::from(offer.slots);
        let addr = offer
            .ring
            .checked_add(u64::from(slot) * u64::from(offer.slot_size))?;
        Some((
            LocalDataRepr {
                len: len as u32,
                slot,
            },
            PeerSlot {
                pid: offer.pid,
                addr,
                ring: offer.ring,
                token: offer.token,
            },
        ))
    }
}

/// A receive half's ring: `slots` slots of `slot_size` bytes, which the
/// peer process writes into, behind a [`GUARD`] that holds the token. Its
/// memory is taken from the system untouched (zeroed pages appear as they
/// are written) and, when the peer may still write, held back from reuse
/// for a while after the connection ends. It is mapped for the ring alone
/// ([`crate::sys::Region`]); the slots start on a huge page and ask for
/// transparent huge pages: the peer's `process_vm_writev` then pins one
/// page per 2 MiB instead of one per 4 KiB, which was a third of the
/// writer's time (docs/design.md §9).
///
/// The peer reads the token back after every write and before it
/// announces the bytes: [`Ring::revoke`] (before a `fork`, after which the
/// connection may go on in the child, whose copy of the ring the peer
/// cannot reach) makes every later write count as refused, and the bytes
/// go on the wire instead. A write the peer made before the revoke landed
/// before the fork, so both processes have it.
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    mem: crate::sys::Region,
    /// Where slot 0 starts in `mem`: on a huge page boundary, the token
    /// in the `GUARD` bytes before it.
    base: usize,
    pub slots: u16,
    pub slot_size: u32,
    /// What the peer was told.
    pub offer: LocalOfferRepr,
    /// LocalData received so far (the next one's slot, modulo `slots`).
    pub received: u32,
    /// Their payload bytes.
    pub bytes_received: u64,
    /// The peer will write no more (its DisConn came).
    pub peer_done: bool,
}

impl Ring {
    /// A ring with its token in front, and the offer that tells of it.
    pub fn open(slots: u16, slot_size: u32) -> Option<Ring> {
        let slots_len = usize::from(slots).checked_mul(slot_size as usize)?;
        let len = slots_len.checked_add(GUARD + HUGE_PAGE)?;
        let mut mem = crate::sys::Region::new(len)?;
        let start = (mem.as_slice().as_ptr() as usize).checked_add(GUARD)?;
        let base = GUARD + (start.next_multiple_of(HUGE_PAGE) - start);
        mem.advise_huge(base..base + slots_len);
        let token = token();
        mem.as_mut_slice()
            .get_mut(base - 4..base)?
            .copy_from_slice(&token.to_ne_bytes());
        let offer = LocalOfferRepr {
            pid: std::process::id(),
            slot_size,
            slots,
            ring: (mem.as_slice().as_ptr() as u64).checked_add(base as u64)?,
            token,
        };
        Some(Ring {
            mem,
            base,
            slots,
            slot_size,
            offer,
            received: 0,
            bytes_received: 0,
            peer_done: false,
        })
    }

    /// Bytes `range` of slot `slot`.
    pub fn slot(&self, slot: u32, range: core::ops::Range<usize>) -> Option<&[u8]> {
        if slot >= u32::from(self.slots) || range.end > self.slot_size as usize {
            return None;
        }
        let at = self.base + slot as usize * self.slot_size as usize;
        self.mem.as_slice().get(at + range.start..at + range.end)
    }

    /// The peer writes no more into this ring: its next check of the
    /// token fails (zero is never a token).
    pub fn revoke(&mut self) {
        if let Some(t) = self.mem.as_mut_slice().get_mut(self.base - 4..self.base) {
            t.fill(0);
        }
    }

    /// The token as it stands.
    #[cfg(test)]
    pub fn token(&self) -> Option<&[u8]> {
        self.mem.as_slice().get(self.base - 4..self.base)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.peer_done || self.mem.as_slice().is_empty() {
            return;
        }
        let now = Instant::now();
        let mut held = QUARANTINED.lock().unwrap_or_else(|e| e.into_inner());
        while held.front().is_some_and(|(t, _)| now >= *t) {
            held.pop_front();
        }
        held.push_back((now + QUARANTINE, core::mem::take(&mut self.mem)));
    }
}

/// Rings of ended connections whose peers may still write, until when.
static QUARANTINED: Mutex<VecDeque<(Instant, crate::sys::Region)>> = Mutex::new(VecDeque::new());

/// A value the peer cannot guess: it proves that what it reads back is
/// this ring of this process.
fn token() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    (h.finish() as u32) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_in_turn_and_only_for_large_payloads() {
        let offer = LocalOfferRepr {
            pid: 9,
            slot_size: 65536,
            slots: 4,
            ring: 0x10000,
            token: 1,
        };
        let mut local = Local::new(true);
        assert_eq!(local.next_slot(65536), None);
        local.send = SendPath::On(Box::new(Writing { offer, sent: 5 }));
        assert_eq!(local.next_slot(LOCAL_MIN - 1), None);
        assert_eq!(local.next_slot(65537), None);
        let (ldh, at) = local.next_slot(65536).unwrap();
        assert_eq!((ldh.len, ldh.slot), (65536, 1));
        assert_eq!((at.pid, at.addr, at.token), (9, 0x20000, 1));
    }

    #[test]
    fn a_rings_slots_start_on_a_huge_page() {
        for slots in [1, 4, 16] {
            let ring = Ring::open(slots, 256 << 10).unwrap();
            assert_eq!(ring.offer.ring % HUGE_PAGE as u64, 0);
            assert!(ring.base >= GUARD);
            assert_eq!(
                ring.slot(u32::from(slots) - 1, 0..256 << 10).unwrap().len(),
                256 << 10
            );
        }
    }

    #[test]
    fn a_ring_starts_with_its_token_and_bounds_its_slots() {
        let mut ring = Ring::open(4, 4096).unwrap();
        let offer = ring.offer;
        assert_eq!(ring.token().unwrap(), offer.token.to_ne_bytes());
        assert_eq!(offer.pid, std::process::id());
        assert!(ring.slot(3, 0..4096).is_some());
        assert!(ring.slot(4, 0..1).is_none());
        assert!(ring.slot(0, 0..4097).is_none());
        ring.revoke();
        assert_eq!(ring.token().unwrap(), [0; 4]);
    }
}
