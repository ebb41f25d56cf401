//! CRC32c kernels for x86-64: the SSE4.2 `crc32` instruction for short
//! pieces, and folding by 256-bit carry-less multiplication (VPCLMULQDQ
//! with AVX2) for long ones.
//!
//! Folding follows Intel's "Fast CRC Computation for Generic Polynomials
//! Using PCLMULQDQ Instruction" in its bit-reflected form. The data is
//! cut into 16-byte lanes, each standing for a polynomial whose first
//! byte holds the highest powers. Eight lanes (128 bytes, four 256-bit
//! registers) are carried at once: each step multiplies every lane by
//! x^1024 modulo P(x) and adds the next 128 bytes, which keeps the sum
//! congruent to the data read so far. At the end the eight lanes are
//! folded into one, the lane's CRC is taken with the `crc32` instruction,
//! and the tail under 16 bytes follows by instruction too.
//!
//! [`advance`] declines long pieces on CPUs with AVX-512, for crc-fast's
//! 512-bit kernel, which is wider, and on CPUs without AVX2 and
//! VPCLMULQDQ, for crc-fast's 128-bit one.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

/// Shortest piece worth folding. Below it the `crc32` instruction, eight
/// bytes a step, is faster than folding's fixed cost (merging eight lanes
/// takes seven dependent folding steps).
pub const FOLD_MIN: usize = 256;

/// Advances the running register `reg` over `data`, or `None` if this
/// CPU has no kernel here better than the portable ones.
#[inline]
pub fn advance(reg: u32, data: &[u8]) -> Option<u32> {
    if !std::is_x86_feature_detected!("sse4.2") {
        return None;
    }
    if data.len() < FOLD_MIN {
        // SAFETY: the CPU has SSE4.2, checked above.
        return Some(unsafe { by_instruction(reg, data) });
    }
    if std::is_x86_feature_detected!("avx512vl") || !can_fold() {
        return None;
    }
    // SAFETY: the CPU has every feature `fold` enables (`can_fold`, and
    // SSE4.2 above).
    Some(unsafe { fold(reg, data) })
}

fn can_fold() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("pclmulqdq")
        && std::is_x86_feature_detected!("vpclmulqdq")
}

/// Advances `reg` over `data` eight bytes an instruction.
#[target_feature(enable = "sse4.2")]
fn by_instruction(mut reg: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    for w in words {
        reg = _mm_crc32_u64(u64::from(reg), u64::from_le_bytes(*w)) as u32;
    }
    for &b in tail {
        reg = _mm_crc32_u8(reg, b);
    }
    reg
}

/// Advances `reg` over `data` by folding (by instruction if it is
/// shorter than one 128-byte block).
#[target_feature(enable = "avx2,pclmulqdq,vpclmulqdq,sse4.2")]
fn fold(reg: u32, data: &[u8]) -> u32 {
    let (blocks, rest) = data.as_chunks::<128>();
    let Some((first, blocks)) = blocks.split_first() else {
        return by_instruction(reg, data);
    };
    // A running register is the CRC of the data with `reg` added to its
    // first 32 bits.
    let mut lanes = load_block(first);
    lanes[0] = _mm256_xor_si256(lanes[0], _mm256_set_epi64x(0, 0, 0, i64::from(reg)));
    let by_128 = _mm256_set_epi64x(
        BY_128[1] as i64,
        BY_128[0] as i64,
        BY_128[1] as i64,
        BY_128[0] as i64,
    );
    for block in blocks {
        let next = load_block(block);
        for (lane, next) in lanes.iter_mut().zip(next) {
            // Quadword 0 of each 128-bit lane is its first 8 bytes, the
            // high powers: it takes the first multiplier.
            let hi = _mm256_clmulepi64_epi128::<0x00>(*lane, by_128);
            let lo = _mm256_clmulepi64_epi128::<0x11>(*lane, by_128);
            *lane = _mm256_xor_si256(_mm256_xor_si256(hi, lo), next);
        }
    }
    let by_16 = _mm_set_epi64x(BY_16[1] as i64, BY_16[0] as i64);
    let step = |lane: __m128i, next: __m128i| {
        let hi = _mm_clmulepi64_si128::<0x00>(lane, by_16);
        let lo = _mm_clmulepi64_si128::<0x11>(lane, by_16);
        _mm_xor_si128(_mm_xor_si128(hi, lo), next)
    };
    let mut one = _mm256_castsi256_si128(lanes[0]);
    one = step(one, _mm256_extracti128_si256::<1>(lanes[0]));
    for pair in &lanes[1..] {
        one = step(one, _mm256_castsi256_si128(*pair));
        one = step(one, _mm256_extracti128_si256::<1>(*pair));
    }
    let (sixteens, tail) = rest.as_chunks::<16>();
    for s in sixteens {
        // SAFETY: 16 readable bytes; the load takes any alignment.
        one = step(one, unsafe { _mm_loadu_si128(s.as_ptr().cast()) });
    }
    // The lane is congruent to all the data so far; its CRC from a zero
    // register, x^32 times it modulo P(x), is what the instruction gives.
    let first = _mm_cvtsi128_si64(one) as u64;
    let second = _mm_extract_epi64::<1>(one) as u64;
    let reg = _mm_crc32_u64(_mm_crc32_u64(0, first), second) as u32;
    by_instruction(reg, tail)
}

/// The 128 bytes of `block` as four 256-bit registers.
#[target_feature(enable = "avx2")]
fn load_block(block: &[u8; 128]) -> [__m256i; 4] {
    let (quarters, _) = block.as_chunks::<32>();
    // SAFETY: each quarter is 32 readable bytes; the load takes any
    // alignment.
    core::array::from_fn(|i| unsafe { _mm256_loadu_si256(quarters[i].as_ptr().cast()) })
}

/// CRC32c's polynomial with its x^32 term (RFC 3720 §12.1), coefficient
/// of x^i at bit i.
const P: u64 = 0x1_1edc_6f41;

/// x^n modulo P(x), coefficient of x^i at bit i.
const fn x_pow_mod(n: u32) -> u64 {
    let mut r = 1u64;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= P;
        }
        i += 1;
    }
    r
}

/// The multipliers that move a lane `bytes` further on: for its first
/// half (which stands for itself times x^64) and its second. Each is
/// bit-reflected to 64 bits like the data, and one power short: the
/// carry-less product of two reflected 64-bit values comes out multiplied
/// by x in the 128-bit lane.
const fn fold_by(bytes: u32) -> [u64; 2] {
    let d = 8 * bytes;
    [
        x_pow_mod(d + 63).reverse_bits(),
        x_pow_mod(d - 1).reverse_bits(),
    ]
}

const BY_128: [u64; 2] = fold_by(128);
const BY_16: [u64; 2] = fold_by(16);

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kernels against the `crc32c` crate, at every length to well past
    /// two blocks, from unaligned starts and several running registers.
    #[test]
    fn kernels_agree_with_an_independent_implementation() {
        if !std::is_x86_feature_detected!("sse4.2") {
            eprintln!("no SSE4.2: nothing to check");
            return;
        }
        let fold_checked = can_fold();
        if !fold_checked {
            eprintln!("no AVX2 and VPCLMULQDQ: the folding kernel is not checked");
        }
        let data: Vec<u8> = (0..1200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in [0, 1, 7] {
            for len in 0..data.len() - start {
                let d = &data[start..start + len];
                for reg in [!0u32, 0, 0x8a91_36aa] {
                    let want = !crc32c::crc32c_append(!reg, d);
                    // SAFETY: SSE4.2 checked above.
                    assert_eq!(
                        unsafe { by_instruction(reg, d) },
                        want,
                        "instruction, {len} bytes"
                    );
                    if len >= 128 && fold_checked {
                        // SAFETY: the features checked above.
                        assert_eq!(unsafe { fold(reg, d) }, want, "folding, {len} bytes");
                    }
                }
            }
        }
    }
}
