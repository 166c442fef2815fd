//! A bounds-checked little-endian cursor over the file's bytes.
//!
//! Every read checks the bytes left first and fails with [`GgufError::Truncated`]; every count
//! is checked against the bytes left (times the smallest encoding of one element) before a
//! vector is sized from it, so a hostile length can never make us allocate more than a small
//! multiple of the file's own size.

use crate::error::{GgufError, Result};

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let available = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                available: available as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16> {
        self.array(what).map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64> {
        self.array(what).map(i64::from_le_bytes)
    }

    pub(crate) fn bool(&mut self) -> Result<bool> {
        let offset = self.pos as u64;
        match self.u8("bool")? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::BadBool { offset, byte }),
        }
    }

    /// A u64 length followed by that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::BadUtf8 { what, offset })
    }

    /// A signed 64-bit count (the header's), which must be ≥ 0 and whose elements (each at
    /// least `min_size` bytes) must fit in the bytes left.
    pub(crate) fn signed_count(&mut self, what: &'static str, min_size: u64) -> Result<usize> {
        let offset = self.pos as u64;
        let value = self.i64(what)?;
        let count = u64::try_from(value).map_err(|_| GgufError::Negative { what, value })?;
        self.fits(what, count, offset, min_size)
    }

    /// An unsigned 64-bit count (an array's) checked like [`Reader::signed_count`].
    pub(crate) fn count(&mut self, what: &'static str, min_size: u64) -> Result<usize> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        self.fits(what, count, offset, min_size)
    }

    fn fits(&self, what: &'static str, count: u64, offset: u64, min_size: u64) -> Result<usize> {
        let available = self.remaining() as u64;
        count
            .checked_mul(min_size)
            .filter(|&need| need <= available)
            .and_then(|_| usize::try_from(count).ok())
            .ok_or(GgufError::CountTooLarge {
                what,
                count,
                offset,
                available,
                min_size,
            })
    }
}
