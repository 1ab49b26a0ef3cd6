//! Reading the tables' stored bytes in order: little-endian numbers,
//! varints, signatures and counted lists; every read is `None` once the
//! bytes end early.

use crate::detect::similarity::{Signature, SIGNATURE_BYTES};

/// The bytes not read yet.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A LEB128 varint of a `u64` (`None`: cut short, or too large).
    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let low = u64::from(b & 0x7f);
            if shift == 63 && low > 1 {
                return None;
            }
            v |= low << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    pub fn signature(&mut self) -> Option<Signature> {
        Signature::from_bytes(self.take(SIGNATURE_BYTES)?)
    }
    pub fn stamped(&mut self) -> Option<(Signature, u64)> {
        Some((self.signature()?, self.u64()?))
    }
    /// `n` items.
    pub fn list<T>(
        &mut self,
        n: usize,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Some(out)
    }
    /// A short list: `n:u8` and `n` items.
    pub fn short<T>(&mut self, item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let n = self.u8()?.into();
        self.list(n, item)
    }
}
