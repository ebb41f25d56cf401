//! Memory registration and protection: RFC 5040 §2.4 and §8.1.1 (RNIC
//! requirements), RFC 5041 §7.1 (the Data Sink's tagged checks), RFC 5040
//! §5.3 and §7.2 (remote invalidation, the Data Source's Read checks).
//!
//! The engine never owns application memory. A [`Memory`] hands out the
//! bytes of numbered regions; the [`Registry`] holds only *metadata*: which
//! part of which region an STag names, with which [`Access`] rights, in
//! which protection domain, and whether the STag is still valid. Every
//! check the peer can trigger is a method here that returns the exact
//! Terminate code ([`TaggedError::ddp_code`], [`TaggedError::rdmap_code`],
//! [`InvalidateError::code`]) before a single byte is touched.
//!
//! # STags
//!
//! An STag is a 24-bit index into the registration table and an 8-bit key
//! ([`Stag::from_parts`]). The key of a slot changes every time the slot is
//! reused, and it is drawn from a seeded generator, so that a stale STag
//! held by the peer fails validation and STags are hard to predict (RFC
//! 5040 §8.1.1 item 8: "An RNIC MUST choose the value of STags in a way
//! difficult to predict"). The seed comes from the caller: nothing in here
//! reads a clock or an entropy source.
//!
//! ```
//! use iwarp::mem::{Access, Memory, MrAttrs, Pd, Registry, VecMemory};
//!
//! let mut mem = VecMemory::new();
//! let region = mem.add(vec![0u8; 4096]);
//! let mut reg = Registry::new(7);
//! let pd = Pd(1);
//! let stag = reg
//!     .register(region, 0, 4096, MrAttrs::new(pd, Access::REMOTE_WRITE))
//!     .unwrap();
//!
//! // The peer may write 100 bytes at TO 4000 ...
//! let span = reg.check_tagged(stag, 4000, 96, pd, Access::REMOTE_WRITE).unwrap();
//! assert_eq!((span.region, span.offset), (region, 4000));
//! // ... but not past the end, and not read at all.
//! assert!(reg.check_tagged(stag, 4000, 97, pd, Access::REMOTE_WRITE).is_err());
//! assert!(reg.check_tagged(stag, 0, 1, pd, Access::REMOTE_READ).is_err());
//! # let _ = mem.region(region);
//! ```

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

use crate::wire::ddp::{self, Stag};
use crate::wire::terminate::TermCode;

/// Names one region of memory that a [`Memory`] can hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RegionId(pub u32);

/// The bytes the engine reads payload from and places payload into.
///
/// The engine never keeps a reference: every call that touches payload
/// takes the memory as an argument. A region may be any length; the engine
/// checks every range against it and treats a missing region or a short
/// one as a local catastrophic error, never as a panic.
///
/// The engine places received bytes through [`Memory::region_range_mut`]
/// and reads a region only where it placed or was given bytes, so a
/// region may grow as it is written (memory committed by use).
pub trait Memory {
    /// The bytes of region `id`, if it exists.
    fn region(&self, id: RegionId) -> Option<&[u8]>;
    /// The bytes of region `id`, writable, if it exists.
    fn region_mut(&mut self, id: RegionId) -> Option<&mut [u8]>;
    /// Bytes `range` of region `id`, writable, if the region exists and
    /// may hold them.
    fn region_range_mut(
        &mut self,
        id: RegionId,
        range: core::ops::Range<usize>,
    ) -> Option<&mut [u8]> {
        self.region_mut(id)?.get_mut(range)
    }
}

/// A [`Memory`] of owned vectors, one per region: for tests and for owned
/// buffers (SDP's private buffers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VecMemory {
    regions: Vec<Option<Vec<u8>>>,
}

impl VecMemory {
    /// No regions.
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Adds a region holding `bytes` and returns its id.
    pub fn add(&mut self, bytes: Vec<u8>) -> RegionId {
        // Reuse a freed slot so that ids stay small.
        if let Some(i) = self.regions.iter().position(Option::is_none) {
            self.regions[i] = Some(bytes);
            return RegionId(i as u32);
        }
        self.regions.push(Some(bytes));
        RegionId((self.regions.len() - 1) as u32)
    }

    /// Removes region `id` and returns its bytes.
    pub fn remove(&mut self, id: RegionId) -> Option<Vec<u8>> {
        self.regions.get_mut(id.0 as usize)?.take()
    }

    /// The bytes of region `id` (shorthand for [`Memory::region`]).
    pub fn get(&self, id: RegionId) -> Option<&[u8]> {
        self.region(id)
    }
}

impl Memory for VecMemory {
    fn region(&self, id: RegionId) -> Option<&[u8]> {
        self.regions.get(id.0 as usize)?.as_deref()
    }

    fn region_mut(&mut self, id: RegionId) -> Option<&mut [u8]> {
        self.regions.get_mut(id.0 as usize)?.as_deref_mut()
    }
}

/// Access rights of a registration (RFC 5040 §3.2: "remote access rights
/// (read, write, or read and write)"; §8.1.1 item 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u8);

impl Access {
    /// No access.
    pub const NONE: Access = Access(0);
    /// The local ULP may read through the STag (a source of local work).
    pub const LOCAL_READ: Access = Access(1);
    /// The local engine may place into it: the Data Sink buffer of one of
    /// our RDMA Reads.
    pub const LOCAL_WRITE: Access = Access(2);
    /// The peer may read it with RDMA Read.
    pub const REMOTE_READ: Access = Access(4);
    /// The peer may write it with RDMA Write.
    pub const REMOTE_WRITE: Access = Access(8);

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0
    }
}

impl BitAnd for Access {
    type Output = Access;
    fn bitand(self, rhs: Access) -> Access {
        Access(self.0 & rhs.0)
    }
}

/// A protection domain (RFC 5040 §8.1.1 item 1: "a specific Stream in a
/// specific Protection Domain cannot access an STag in a different
/// Protection Domain").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Pd(pub u32);

/// Which streams may use an STag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    /// Every stream of the protection domain; since it may be shared, the
    /// peer may not invalidate it (RFC 5040 §8.1.1 item 7).
    #[default]
    Pd,
    /// Only the stream of the table it is registered in; the peer may
    /// invalidate it with Send with Invalidate (RFC 5040 §5.3).
    Stream,
}

/// Attributes of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrAttrs {
    /// The protection domain it belongs to.
    pub pd: Pd,
    /// The rights it grants.
    pub access: Access,
    /// The Tagged Offset of its first byte (RFC 5040 §5.1: "The Tagged
    /// Offset of a Tagged Buffer MAY start at a non-zero value"). 0 by
    /// default.
    pub base_to: u64,
    /// Which streams may use it.
    pub scope: Scope,
}

impl MrAttrs {
    /// Zero-based, PD-scoped attributes.
    pub const fn new(pd: Pd, access: Access) -> MrAttrs {
        MrAttrs {
            pd,
            access,
            base_to: 0,
            scope: Scope::Pd,
        }
    }

    /// The same, with the first byte at Tagged Offset `base_to`.
    pub const fn with_base_to(mut self, base_to: u64) -> MrAttrs {
        self.base_to = base_to;
        self
    }

    /// The same, with `scope`.
    pub const fn with_scope(mut self, scope: Scope) -> MrAttrs {
        self.scope = scope;
        self
    }
}

/// Where a checked range lies in [`Memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// The region.
    pub region: RegionId,
    /// Offset of the first byte in the region.
    pub offset: usize,
}

/// Why a tagged access is refused (RFC 5041 §7.1 tagged checks; RFC 5040
/// §7.2 checks 4a–4e). The same failure has a DDP code when the Data Sink
/// places (RDMA Write, Read Response) and an RDMAP code when the Data
/// Source reads (RDMA Read Request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaggedError {
    /// No such STag, a stale key, or an invalidated STag.
    InvalidStag,
    /// A valid STag of another protection domain.
    NotAssociated,
    /// The STag lacks the right the access needs.
    AccessRights,
    /// TO plus length wraps 2^64.
    ToWrap,
    /// The range leaves the registered range.
    BaseBounds,
}

impl TaggedError {
    /// The code when the Data Sink refuses to place (RFC 5041 §7.2, Tagged
    /// Buffer Error).
    pub fn ddp_code(self) -> TermCode {
        match self {
            TaggedError::InvalidStag => TermCode::DDP_INVALID_STAG,
            TaggedError::NotAssociated => TermCode::DDP_STAG_NOT_ASSOCIATED,
            // RFC 5041 §7.2 has no access-rights code. Check 2 ("The STag
            // has an associated buffer that allows Placement of the
            // payload") fails, and for this stream's writes the STag is as
            // good as invalid; Linux siw makes the same choice.
            TaggedError::AccessRights => TermCode::DDP_INVALID_STAG,
            TaggedError::ToWrap => TermCode::DDP_TO_WRAP,
            TaggedError::BaseBounds => TermCode::DDP_BASE_BOUNDS,
        }
    }

    /// The code when the Data Source refuses an RDMA Read Request (RFC 5040
    /// §4.8 Figure 9, Remote Protection Error).
    pub fn rdmap_code(self) -> TermCode {
        match self {
            TaggedError::InvalidStag => TermCode::RDMAP_INVALID_STAG,
            TaggedError::NotAssociated => TermCode::RDMAP_STAG_NOT_ASSOCIATED,
            TaggedError::AccessRights => TermCode::RDMAP_ACCESS_RIGHTS,
            TaggedError::ToWrap => TermCode::RDMAP_TO_WRAP,
            TaggedError::BaseBounds => TermCode::RDMAP_BASE_BOUNDS,
        }
    }
}

impl fmt::Display for TaggedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaggedError::InvalidStag => "invalid STag",
            TaggedError::NotAssociated => "STag not associated with this stream",
            TaggedError::AccessRights => "access rights violation",
            TaggedError::ToWrap => "tagged offset wraps",
            TaggedError::BaseBounds => "base or bounds violation",
        })
    }
}

impl std::error::Error for TaggedError {}

/// Why a remote invalidation (Send with Invalidate) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidateError {
    /// RFC 5040 §7.2 check 4: "The Invalidate STag MUST be valid."
    InvalidStag,
    /// RFC 5040 §5.3: not associated with this stream, or (§8.1.1 item 7)
    /// possibly shared by several streams.
    CannotInvalidate,
}

impl InvalidateError {
    /// The Terminate code (RFC 5040 §4.8 Figure 9, Remote Protection Error).
    pub fn code(self) -> TermCode {
        match self {
            InvalidateError::InvalidStag => TermCode::RDMAP_INVALID_STAG,
            // RFC 5040 §5.3: "issue a Terminate Message with the STag
            // Cannot be Invalidated Terminate Error Code". Figure 9 lists it
            // under both Remote Protection and Remote Operation; an STag the
            // peer may not touch is a protection matter (siw agrees).
            InvalidateError::CannotInvalidate => TermCode::RDMAP_PROT_CANNOT_INVALIDATE,
        }
    }
}

impl fmt::Display for InvalidateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidateError::InvalidStag => "invalidate STag is not valid",
            InvalidateError::CannotInvalidate => "STag cannot be invalidated by the peer",
        })
    }
}

impl std::error::Error for InvalidateError {}

/// Local misuse of the registration table.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegError {
    /// All 2^24 - 1 indexes are in use.
    TableFull,
    /// The registered range does not fit: offset plus length overflows, or
    /// base TO plus length wraps 2^64.
    BadRange,
    /// No registration has this STag (wrong index or stale key).
    UnknownStag,
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegError::TableFull => "registration table full",
            RegError::BadRange => "registered range overflows",
            RegError::UnknownStag => "no registration with this STag",
        })
    }
}

impl std::error::Error for RegError {}

/// What the table knows about one registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrInfo {
    /// The STag naming it.
    pub stag: Stag,
    /// The region it lies in.
    pub region: RegionId,
    /// Its first byte in the region.
    pub offset: usize,
    /// Its length.
    pub len: u64,
    /// Its attributes.
    pub attrs: MrAttrs,
    /// Whether the STag is valid (not invalidated).
    pub valid: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u8,
    mr: Option<MrInfo>,
}

/// The registration table of one stream: metadata only.
#[derive(Debug, Clone)]
pub struct Registry {
    /// Index 0 is never handed out, so no STag is 0x000000xx.
    slots: Vec<Slot>,
    free: Vec<u32>,
    rng: u64,
}

impl Registry {
    /// An empty table whose keys come from `seed`.
    pub fn new(seed: u64) -> Registry {
        Registry {
            slots: vec![Slot { key: 0, mr: None }],
            free: Vec::new(),
            // splitmix64 needs no particular seed; mix it once anyway.
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn next_key(&mut self) -> u8 {
        // splitmix64: enough to make keys unpredictable without a seed.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u8
    }

    /// Registers `len` bytes of `region` from `offset` and returns the STag
    /// that names them. The bytes are not looked at: every use checks them
    /// against the [`Memory`] it is given.
    pub fn register(
        &mut self,
        region: RegionId,
        offset: usize,
        len: u64,
        attrs: MrAttrs,
    ) -> Result<Stag, RegError> {
        let len_usize = usize::try_from(len).map_err(|_| RegError::BadRange)?;
        if offset.checked_add(len_usize).is_none() || ddp::to_end(attrs.base_to, len).is_none() {
            return Err(RegError::BadRange);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = self.slots.len() as u32;
                if index > Stag::MAX_INDEX {
                    return Err(RegError::TableFull);
                }
                self.slots.push(Slot { key: 0, mr: None });
                index
            }
        };
        let mut key = self.next_key();
        let slot = &mut self.slots[index as usize];
        // A reused slot never gets its previous key back.
        if key == slot.key {
            key = key.wrapping_add(1);
        }
        slot.key = key;
        let stag = Stag::from_parts(index, key);
        slot.mr = Some(MrInfo {
            stag,
            region,
            offset,
            len,
            attrs,
            valid: true,
        });
        Ok(stag)
    }

    fn slot(&self, stag: Stag) -> Option<&MrInfo> {
        self.slots
            .get(stag.index() as usize)?
            .mr
            .as_ref()
            .filter(|mr| mr.stag == stag)
    }

    fn slot_mut(&mut self, stag: Stag) -> Option<&mut MrInfo> {
        self.slots
            .get_mut(stag.index() as usize)?
            .mr
            .as_mut()
            .filter(|mr| mr.stag == stag)
    }

    /// What the table holds for `stag` (valid or not).
    pub fn get(&self, stag: Stag) -> Option<&MrInfo> {
        self.slot(stag)
    }

    /// Local invalidation: the STag stays in the table but no longer
    /// validates (RFC 5040 §8.1.1 item 6: the network "can no longer modify
    /// an Advertised Buffer after the ULP revokes remote access rights").
    pub fn invalidate(&mut self, stag: Stag) -> Result<(), RegError> {
        let mr = self.slot_mut(stag).ok_or(RegError::UnknownStag)?;
        mr.valid = false;
        Ok(())
    }

    /// Makes an invalidated STag valid again with the same attributes.
    pub fn revalidate(&mut self, stag: Stag) -> Result<(), RegError> {
        let mr = self.slot_mut(stag).ok_or(RegError::UnknownStag)?;
        mr.valid = true;
        Ok(())
    }

    /// Removes the registration; its index is reused with another key.
    pub fn deregister(&mut self, stag: Stag) -> Result<MrInfo, RegError> {
        let index = stag.index();
        let mr = *self.slot(stag).ok_or(RegError::UnknownStag)?;
        self.slots[index as usize].mr = None;
        self.free.push(index);
        Ok(mr)
    }

    /// Checks a tagged access of `len` bytes at `to` by a stream of `pd`
    /// needing `need`, and returns where the bytes are. Used for RFC 5041
    /// §7.1 (placement) and RFC 5040 §7.2 check 4 (Read source), in the
    /// order: STag valid, associated, rights, TO wrap, bounds.
    ///
    /// Only for non-zero lengths: RFC 5041 §5.2 "The STag and TO fields
    /// MUST NOT be checked for a zero-length Tagged DDP Message".
    pub fn check_tagged(
        &self,
        stag: Stag,
        to: u64,
        len: u64,
        pd: Pd,
        need: Access,
    ) -> Result<Span, TaggedError> {
        // RFC 5041 §7.1 tagged check 1: "The STag is valid for this stream."
        let mr = self
            .slot(stag)
            .filter(|mr| mr.valid)
            .ok_or(TaggedError::InvalidStag)?;
        // RFC 5040 §8.1.1 item 1: no access to an STag of another PD.
        if mr.attrs.pd != pd {
            return Err(TaggedError::NotAssociated);
        }
        // RFC 5041 §7.1 check 2: the STag "allows Placement"; RFC 5040
        // §8.1.1 item 5: read, write, or read and write access.
        if !mr.attrs.access.contains(need) {
            return Err(TaggedError::AccessRights);
        }
        // RFC 5041 §7.1 check 5: "A 64-bit unsigned sum of the DDP Segment
        // payload length and the TO does not wrap."
        let end = ddp::to_end(to, len).ok_or(TaggedError::ToWrap)?;
        // Checks 3 and 4: TO and TO + length within the registered range.
        // base_to + len does not wrap (checked at registration).
        let limit = mr.attrs.base_to + mr.len;
        if to < mr.attrs.base_to || end > limit {
            return Err(TaggedError::BaseBounds);
        }
        // In range of usize: to - base_to < len, and offset + len fits.
        let offset = mr.offset + (to - mr.attrs.base_to) as usize;
        Ok(Span {
            region: mr.region,
            offset,
        })
    }

    /// Whether the peer (a stream of `pd`) may invalidate `stag` with Send
    /// with Invalidate (RFC 5040 §5.3, §7.2 checks 4 and 5).
    pub fn check_remote_invalidate(&self, stag: Stag, pd: Pd) -> Result<(), InvalidateError> {
        let mr = self
            .slot(stag)
            .filter(|mr| mr.valid)
            .ok_or(InvalidateError::InvalidStag)?;
        // RFC 5040 §5.3: "Invalidate the STag if it is associated with the
        // RDMAP Stream; or issue a Terminate Message with the STag Cannot
        // be Invalidated Terminate Error Code". §8.1.1 item 7: not if "the
        // STag is shared on multiple streams", which a PD-scoped one may be.
        if mr.attrs.pd != pd || mr.attrs.scope != Scope::Stream {
            return Err(InvalidateError::CannotInvalidate);
        }
        Ok(())
    }

    /// Remote invalidation by Send with Invalidate from a stream of `pd`:
    /// [`Registry::check_remote_invalidate`], then the STag is invalid.
    pub fn remote_invalidate(&mut self, stag: Stag, pd: Pd) -> Result<(), InvalidateError> {
        self.check_remote_invalidate(stag, pd)?;
        if let Some(mr) = self.slot_mut(stag) {
            mr.valid = false;
        }
        Ok(())
    }

    /// Number of registrations in the table.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.mr.is_some()).count()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: Pd = Pd(3);

    fn table() -> (Registry, Stag) {
        let mut reg = Registry::new(1);
        let stag = reg
            .register(
                RegionId(5),
                100,
                1000,
                MrAttrs::new(PD, Access::REMOTE_WRITE | Access::REMOTE_READ).with_base_to(5000),
            )
            .unwrap();
        (reg, stag)
    }

    #[test]
    fn check_in_bounds() {
        let (reg, stag) = table();
        let span = reg
            .check_tagged(stag, 5000, 1000, PD, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            span,
            Span {
                region: RegionId(5),
                offset: 100
            }
        );
        let span = reg
            .check_tagged(stag, 5999, 1, PD, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(span.offset, 1099);
    }

    #[test]
    fn check_each_failure_and_its_codes() {
        let (mut reg, stag) = table();
        let w = Access::REMOTE_WRITE;
        let cases = [
            (
                reg.check_tagged(Stag(stag.0 ^ 1), 5000, 1, PD, w),
                TaggedError::InvalidStag,
            ),
            (
                reg.check_tagged(Stag::from_parts(77, 0), 5000, 1, PD, w),
                TaggedError::InvalidStag,
            ),
            (
                reg.check_tagged(stag, 5000, 1, Pd(4), w),
                TaggedError::NotAssociated,
            ),
            (
                reg.check_tagged(stag, 5000, 1, PD, Access::LOCAL_WRITE),
                TaggedError::AccessRights,
            ),
            (
                reg.check_tagged(stag, u64::MAX, 2, PD, w),
                TaggedError::ToWrap,
            ),
            (
                reg.check_tagged(stag, 4999, 1, PD, w),
                TaggedError::BaseBounds,
            ),
            (
                reg.check_tagged(stag, 5000, 1001, PD, w),
                TaggedError::BaseBounds,
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, Err(want));
        }
        assert_eq!(TaggedError::ToWrap.ddp_code(), TermCode::DDP_TO_WRAP);
        assert_eq!(TaggedError::ToWrap.rdmap_code(), TermCode::RDMAP_TO_WRAP);
        assert_eq!(
            TaggedError::AccessRights.rdmap_code(),
            TermCode::RDMAP_ACCESS_RIGHTS
        );
        reg.invalidate(stag).unwrap();
        assert_eq!(
            reg.check_tagged(stag, 5000, 1, PD, w),
            Err(TaggedError::InvalidStag)
        );
        reg.revalidate(stag).unwrap();
        assert!(reg.check_tagged(stag, 5000, 1, PD, w).is_ok());
    }

    #[test]
    fn reuse_changes_key() {
        let (mut reg, stag) = table();
        reg.deregister(stag).unwrap();
        let again = reg
            .register(RegionId(5), 0, 10, MrAttrs::new(PD, Access::REMOTE_WRITE))
            .unwrap();
        assert_eq!(again.index(), stag.index());
        assert_ne!(again, stag);
        assert_eq!(
            reg.check_tagged(stag, 0, 1, PD, Access::REMOTE_WRITE),
            Err(TaggedError::InvalidStag)
        );
        assert_eq!(reg.deregister(stag), Err(RegError::UnknownStag));
        assert_eq!(reg.len(), 1);
    }

    #[test]
    fn remote_invalidation_rules() {
        let mut reg = Registry::new(2);
        let bound = reg
            .register(
                RegionId(0),
                0,
                8,
                MrAttrs::new(PD, Access::REMOTE_WRITE).with_scope(Scope::Stream),
            )
            .unwrap();
        let shared = reg
            .register(RegionId(0), 0, 8, MrAttrs::new(PD, Access::REMOTE_WRITE))
            .unwrap();
        assert_eq!(
            reg.remote_invalidate(shared, PD),
            Err(InvalidateError::CannotInvalidate)
        );
        assert_eq!(
            reg.remote_invalidate(bound, Pd(9)),
            Err(InvalidateError::CannotInvalidate)
        );
        assert_eq!(reg.remote_invalidate(bound, PD), Ok(()));
        assert_eq!(
            reg.remote_invalidate(bound, PD),
            Err(InvalidateError::InvalidStag)
        );
        assert_eq!(
            InvalidateError::CannotInvalidate.code(),
            TermCode::RDMAP_PROT_CANNOT_INVALIDATE
        );
    }

    #[test]
    fn bad_ranges() {
        let mut reg = Registry::new(0);
        let a = MrAttrs::new(PD, Access::NONE);
        assert_eq!(
            reg.register(RegionId(0), usize::MAX, 1, a),
            Err(RegError::BadRange)
        );
        assert_eq!(
            reg.register(RegionId(0), 0, 2, a.with_base_to(u64::MAX)),
            Err(RegError::BadRange)
        );
    }

    #[test]
    fn vec_memory() {
        let mut mem = VecMemory::new();
        let a = mem.add(vec![1, 2, 3]);
        let b = mem.add(vec![4]);
        assert_eq!(mem.region(a), Some(&[1u8, 2, 3][..]));
        mem.region_mut(b).unwrap()[0] = 9;
        assert_eq!(mem.remove(b), Some(vec![9]));
        assert_eq!(mem.region(b), None);
        assert_eq!(mem.add(vec![]), b);
        assert_eq!(mem.region(RegionId(99)), None);
    }
}
