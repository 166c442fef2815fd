//! GPT-2's byte-to-unicode map: each byte becomes one printable code point, so that BPE can
//! work on text whose every "character" is one byte of the input.
//!
//! Bytes 0x21–0x7E, 0xA1–0xAC and 0xAE–0xFF stand for themselves; the other 68 bytes, in
//! increasing order, take U+0100, U+0101, … (space → `Ġ` U+0120, `\n` → `Ċ` U+010A).

/// The code point byte `b` is written as.
pub(crate) const fn byte_to_char(b: u8) -> char {
    let mut n = 0u32;
    let mut x = 0u32;
    while x < b as u32 {
        if !stands_for_itself(x as u8) {
            n += 1;
        }
        x += 1;
    }
    if stands_for_itself(b) {
        b as char
    } else {
        match char::from_u32(0x100 + n) {
            Some(c) => c,
            None => '\u{FFFD}', // unreachable: 0x100 + n < 0x144
        }
    }
}

const fn stands_for_itself(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The 256 code points, indexed by byte.
pub(crate) static BYTE_CHARS: [char; 256] = {
    let mut t = ['\0'; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = byte_to_char(b as u8);
        b += 1;
    }
    t
};

/// The bytes that do not stand for themselves, in increasing order (U+0100 + i ↔ `SHIFTED[i]`).
static SHIFTED: [u8; 68] = {
    let mut t = [0u8; 68];
    let (mut b, mut n) = (0usize, 0usize);
    while b < 256 {
        if !stands_for_itself(b as u8) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
};

/// The byte code point `c` stands for, if it is one of the 256.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 0x100 && stands_for_itself(u as u8) {
        Some(u as u8)
    } else if (0x100..0x144).contains(&u) {
        Some(SHIFTED[(u - 0x100) as usize])
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples_and_round_trip() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        assert_eq!(byte_to_char(b'a'), 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_CHARS[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('你'), None);
    }
}
