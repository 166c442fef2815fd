//! The `smollm` pre-tokenizer: llama.cpp splits the text at every number code point first
//! (`\p{N}`, each one its own piece), then runs its hand-written GPT-2 matcher inside each
//! piece:
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//!
//! The look-ahead `\s+(?!\S)` is evaluated per piece: a whitespace run of two or more followed
//! by a non-space *in the same piece* gives the run minus its last character; a run that ends
//! the piece is taken whole (so a space before a digit becomes a lone `Ġ`). Only U+0020 is the
//! optional leading space. Letters and numbers are the Unicode general categories L* and N*
//! (from `unicode-general-category`); whitespace is llama.cpp's list, which equals Unicode's
//! `White_Space` property.

use unicode_general_category::{GeneralCategory as G, get_general_category};

#[derive(Copy, Clone, Default)]
struct Flags {
    letter: bool,
    number: bool,
    whitespace: bool,
    /// In the piece at all (llama.cpp's "flags non-zero").
    present: bool,
}

fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches!(
        get_general_category(c),
        G::DecimalNumber | G::LetterNumber | G::OtherNumber
    )
}

fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
    )
}

/// Flags of the 128 ASCII characters, worked out once.
static ASCII: [Flags; 128] = {
    let mut t = [Flags {
        letter: false,
        number: false,
        whitespace: false,
        present: true,
    }; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        t[i].letter = c.is_ascii_alphabetic();
        t[i].number = c.is_ascii_digit();
        t[i].whitespace = matches!(c, b'\t'..=b'\r' | b' ');
        i += 1;
    }
    t
};

fn flags(c: char) -> Flags {
    if c.is_ascii() {
        return ASCII[c as usize];
    }
    Flags {
        letter: is_letter(c),
        number: is_number(c),
        whitespace: is_whitespace(c),
        present: true,
    }
}

/// Splits `text` into pre-tokenizer words, calling `word` with each one's byte range, in
/// order. `scratch` is reused between calls to avoid allocating per piece.
pub(crate) fn split(
    text: &str,
    scratch: &mut Vec<(usize, char)>,
    mut word: impl FnMut(usize, usize),
) {
    let mut run_start = 0;
    for (i, c) in text.char_indices() {
        if is_number(c) {
            gpt2(text, run_start, i, scratch, &mut word);
            word(i, i + c.len_utf8());
            run_start = i + c.len_utf8();
        }
    }
    gpt2(text, run_start, text.len(), scratch, &mut word);
}

/// llama.cpp's GPT-2 matcher on the piece `text[start..end]`.
fn gpt2(
    text: &str,
    start: usize,
    end: usize,
    cps: &mut Vec<(usize, char)>,
    word: &mut impl FnMut(usize, usize),
) {
    if start == end {
        return;
    }
    cps.clear();
    cps.extend(text[start..end].char_indices().map(|(i, c)| (start + i, c)));
    let n = cps.len();
    let at = |i: usize| if i < n { cps[i].1 } else { '\0' };
    let fl = |i: usize| {
        if i < n {
            flags(cps[i].1)
        } else {
            Flags::default()
        }
    };
    let byte = |i: usize| if i < n { cps[i].0 } else { end };
    let mut prev = 0;
    let mut emit = |to: usize, prev: &mut usize| {
        if to > *prev {
            word(byte(*prev), byte(to));
        }
        *prev = to;
    };
    let mut pos = 0;
    while pos < n {
        let c = at(pos);
        // 's|'t|'re|'ve|'m|'ll|'d
        if c == '\'' && pos + 1 < n {
            let next = at(pos + 1);
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(pos, &mut prev);
                continue;
            }
            if pos + 2 < n && matches!((next, at(pos + 2)), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(pos, &mut prev);
                continue;
            }
        }
        let space = usize::from(c == ' ');
        let f2 = fl(pos + space);
        //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
        let class: Option<fn(Flags) -> bool> = if f2.letter {
            Some(|f| f.letter)
        } else if f2.number {
            Some(|f| f.number)
        } else if f2.present && !(f2.whitespace || f2.letter || f2.number) {
            Some(|f| f.present && !(f.whitespace || f.letter || f.number))
        } else {
            None
        };
        if let Some(class) = class {
            pos += space;
            while class(fl(pos)) {
                pos += 1;
            }
            emit(pos, &mut prev);
            continue;
        }
        let mut spaces = 0;
        while fl(pos + spaces).whitespace {
            spaces += 1;
        }
        if spaces > 1 && pos + spaces < n {
            // \s+(?!\S): leave the last space for the word after it.
            pos += spaces - 1;
        } else if spaces > 0 {
            pos += spaces;
        } else {
            pos += 1;
        }
        emit(pos, &mut prev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(text, &mut Vec::new(), |a, b| out.push(&text[a..b]));
        out
    }

    #[test]
    fn spec_examples() {
        assert_eq!(words("Hello world"), ["Hello", " world"]);
        assert_eq!(
            words("x = 10 + 20;"),
            ["x", " =", " ", "1", "0", " +", " ", "2", "0", ";"]
        );
        assert_eq!(
            words("I'm   fine.  OK"),
            ["I", "'m", "  ", " fine", ".", " ", " OK"]
        );
        assert_eq!(
            words("tab\there\n\nnewlines  "),
            ["tab", "\t", "here", "\n", "\n", "newlines", "  "]
        );
        assert_eq!(words("héllo 👋"), ["héllo", " 👋"]);
        assert_eq!(
            words("don't I'LL 'x"),
            ["don", "'t", " I", "'", "LL", " '", "x"]
        );
        assert_eq!(words("a  \n b"), ["a", "  \n", " b"]);
        assert_eq!(words("Ⅻ²٣"), ["Ⅻ", "²", "٣"]);
        assert_eq!(words(""), [] as [&str; 0]);
        assert_eq!(words(" "), [" "]);
    }
}
