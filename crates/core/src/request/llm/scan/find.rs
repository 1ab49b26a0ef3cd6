//! Finding the next byte that matters: a `"` or `\` inside a string, a
//! structural byte inside a container; sixteen bytes at a time with
//! WebAssembly SIMD, eight at a time (SWAR) in WebAssembly without it, and
//! natively with `memchr` (the widest vectors the CPU has).

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
const ONES: u64 = 0x0101_0101_0101_0101;
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The first `"` or `\` among eight bytes (SWAR).
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn quote_or_backslash_in(chunk: &[u8]) -> Option<usize> {
    let mut word = [0u8; 8];
    word.copy_from_slice(chunk.get(..8)?);
    let v = u64::from_le_bytes(word);
    let q = v ^ (ONES * u64::from(b'"'));
    let bs = v ^ (ONES * u64::from(b'\\'));
    // A byte of `x` is zero exactly where the lowest set high bit of
    // (x - 0x01..) & !x & 0x80.. says (higher ones may be borrow noise).
    let hit = (q.wrapping_sub(ONES) & !q | bs.wrapping_sub(ONES) & !bs) & HIGHS;
    (hit != 0).then_some((hit.trailing_zeros() / 8) as usize)
}

/// The first `"` or `\` in `s`, sixteen bytes at a time with WebAssembly
/// SIMD (strings are most of an LLM body).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(super) fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_splat, v128, v128_load, v128_or};
    let (q, bs) = (u8x16_splat(b'"'), u8x16_splat(b'\\'));
    let mut at = 0;
    while at + 16 <= s.len() {
        // SAFETY: `at + 16 <= s.len()`, so the 16 bytes read are in `s`;
        // wasm loads need no alignment.
        let v = unsafe { v128_load(s.as_ptr().add(at).cast::<v128>()) };
        let hits = u8x16_bitmask(v128_or(u8x16_eq(v, q), u8x16_eq(v, bs)));
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize);
        }
        at += 16;
    }
    s.get(at..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| at + k)
}

/// The first `"` or `\` in `s`, natively: the first sixteen bytes eight at
/// a time (keys and roles end there, before a vector search would have
/// started), then `memchr`'s vector search.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    let mut at = 0;
    for chunk in s.chunks_exact(8).take(2) {
        if let Some(k) = quote_or_backslash_in(chunk) {
            return Some(at + k);
        }
        at += 8;
    }
    memchr::memchr2(b'"', b'\\', s.get(at..)?).map(|k| at + k)
}

/// The first `"` or `\` in `s`, eight bytes at a time (SWAR: where wasm
/// SIMD is not available).
#[cfg(all(target_arch = "wasm32", not(target_feature = "simd128")))]
pub(super) fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        if let Some(k) = quote_or_backslash_in(chunk) {
            return Some(at + k);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| at + k)
}

/// The bytes that matter between strings inside a container.
fn is_structural(c: u8) -> bool {
    matches!(c, b'"' | b'{' | b'[' | b'}' | b']')
}

/// The first structural byte (`"`, `{`, `[`, `}`, `]`) in `s`.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(super) fn find_structural(s: &[u8]) -> Option<usize> {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_splat, v128, v128_load, v128_or};
    let marks = [b'"', b'{', b'[', b'}', b']'].map(|c| u8x16_splat(c));
    let mut at = 0;
    while at + 16 <= s.len() {
        // SAFETY: as in `find_quote_or_backslash`.
        let v = unsafe { v128_load(s.as_ptr().add(at).cast::<v128>()) };
        let hit = marks.iter().fold(u8x16_eq(v, marks[0]), |acc, m| {
            v128_or(acc, u8x16_eq(v, *m))
        });
        let hits = u8x16_bitmask(hit);
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize);
        }
        at += 16;
    }
    s.get(at..)?
        .iter()
        .position(|&c| is_structural(c))
        .map(|k| at + k)
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
pub(super) fn find_structural(s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| is_structural(c))
}
