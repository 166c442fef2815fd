//! The special-token partition: before any pre-tokenizing, literal occurrences of special
//! tokens are cut out of the raw text, longest token text first, so BPE never runs across
//! them. CONTROL and UNKNOWN tokens take part only when `parse_special` is on;
//! USER_DEFINED ones always do (llama.cpp's `tokenizer_st_partition`).

/// A piece of the input after the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text `text[start..end]`, to be pre-tokenized and merged.
    Text(usize, usize),
    /// A special token.
    Token(u32),
}

/// Splits `text` at every occurrence of each `(id, token text, always)` in `specials` (already
/// sorted longest first), skipping those with `always == false` unless `parse_special`.
pub(crate) fn partition(
    text: &str,
    specials: &[(u32, Box<str>, bool)],
    parse_special: bool,
) -> Vec<Fragment> {
    let mut frags = if text.is_empty() {
        Vec::new()
    } else {
        vec![Fragment::Text(0, text.len())]
    };
    for (id, needle, always) in specials {
        if !(*always || parse_special) || needle.is_empty() {
            continue;
        }
        if !frags
            .iter()
            .any(|f| matches!(*f, Fragment::Text(a, b) if text[a..b].contains(&**needle)))
        {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(mut a, b) = f else {
                next.push(f);
                continue;
            };
            while let Some(p) = text[a..b].find(&**needle) {
                if p > 0 {
                    next.push(Fragment::Text(a, a + p));
                }
                next.push(Fragment::Token(*id));
                a += p + needle.len();
            }
            if a < b {
                next.push(Fragment::Text(a, b));
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_first_and_parse_special() {
        let specials: Vec<(u32, Box<str>, bool)> = vec![
            (1, "<|im_start|>".into(), false),
            (2, "<|im_end|>".into(), false),
            (9, "<u>".into(), true),
            (8, "<".into(), false),
        ];
        let t = "<|im_start|>user<u>Hi<|im_end|>";
        use Fragment::*;
        assert_eq!(
            partition(t, &specials, true),
            [Token(1), Text(12, 16), Token(9), Text(19, 21), Token(2)]
        );
        assert_eq!(
            partition(t, &specials, false),
            [Text(0, 16), Token(9), Text(19, 31)]
        );
        assert_eq!(partition("", &specials, true), []);
        assert_eq!(
            partition("a<b", &specials, true),
            [Text(0, 1), Token(8), Text(2, 3)]
        );
    }
}
