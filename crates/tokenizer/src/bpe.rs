//! BPE merges by rank, as llama.cpp applies them.
//!
//! Every string that can be a symbol — each vocabulary token, each side and each result of a
//! merge, each of the 256 byte characters — is interned once, when the tokenizer is built, so
//! merging compares integers: `merges[(left, right)] = (rank, merged)`. A word starts as one
//! symbol per byte (one byte-character each); a min-heap of adjacent ranked pairs ordered by
//! (rank, left position) is popped until empty, skipping pairs whose sides changed since they
//! were queued, merging the rest and queueing the new neighbour pairs. That is O(n log n) per
//! word, not the quadratic "find the best pair again" loop.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::bytes::BYTE_CHARS;

/// Interned symbols and the merge table.
pub(crate) struct Bpe {
    /// Symbol → its token id when the symbol is a vocabulary token.
    sym_token: Vec<Option<u32>>,
    /// Symbol → its (byte-character) text, for the fallback of symbols that are not tokens.
    sym_text: Vec<Box<str>>,
    /// (left, right) → (rank, merged).
    merges: HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>,
    /// Byte → its one-character symbol.
    byte_sym: [u32; 256],
    /// ASCII byte-character → the token of that one character (the fallback).
    ascii_token: [Option<u32>; 128],
}

/// The merge table's hasher: keys are two symbol ids packed in a u64, hashed by one multiply
/// and a fold (SipHash, the std default, made the look-ups half of the tokenizing time).
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, k: u64) {
        let h = (self.0 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn key(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

struct Interner {
    ids: HashMap<String, u32>,
    texts: Vec<Box<str>>,
}

impl Interner {
    fn get(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.texts.len() as u32;
        self.texts.push(s.into());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// A queued pair: (rank, left position, right position, left symbol, right symbol).
type Pair = (u32, u32, u32, u32, u32);

/// Reusable buffers for [`Bpe::word`].
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Pair>>,
}

impl Bpe {
    /// `tokens[i]` is the text of token `i`; `merges` are `"left right"` strings in rank order
    /// (split at the first space at byte index ≥ 1; entries without one are ignored, and a
    /// repeated pair keeps its first rank, as in llama.cpp).
    pub(crate) fn new(tokens: &[String], merges: &[String]) -> Bpe {
        let mut interner = Interner {
            ids: HashMap::with_capacity(tokens.len() + merges.len() / 4),
            texts: Vec::with_capacity(tokens.len()),
        };
        let mut sym_token = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // A repeated text maps to its last id (llama.cpp fills its map in id order).
            let id = interner.get(t);
            if sym_token.len() <= id as usize {
                sym_token.resize(id as usize + 1, None);
            }
            sym_token[id as usize] = Some(i as u32);
        }
        let mut table = HashMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, m) in merges.iter().enumerate() {
            let Some(split) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..split], &m[split + 1..]);
            let l = interner.get(a);
            let r = interner.get(b);
            let merged = interner.get(&format!("{a}{b}"));
            table.entry(key(l, r)).or_insert((rank as u32, merged));
        }
        let mut byte_sym = [0u32; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_sym.iter_mut().enumerate() {
            *slot = interner.get(BYTE_CHARS[b].encode_utf8(&mut buf));
        }
        let mut ascii_token = [None; 128];
        for (c, slot) in ascii_token.iter_mut().enumerate() {
            let s = (c as u8 as char).to_string();
            *slot = interner
                .ids
                .get(&s)
                .and_then(|&id| sym_token.get(id as usize).copied().flatten());
        }
        sym_token.resize(interner.texts.len(), None);
        Bpe {
            sym_token,
            sym_text: interner.texts,
            merges: table,
            byte_sym,
            ascii_token,
        }
    }

    /// Appends the tokens of one pre-tokenizer word (raw bytes) to `out`.
    ///
    /// Indexing: positions index `s.syms` (one per byte, linked by `prev`/`next`); symbol ids
    /// come from the interner, so they are below `sym_token.len() == sym_text.len()`; a pair
    /// is queued only when its merge is in the table, so the popped pair's lookup finds it.
    pub(crate) fn word(&self, bytes: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        if bytes.len() >= NONE as usize {
            // Positions are u32 (NONE is the end marker): a word of 4 GiB or more is merged
            // in pieces that fit, rather than letting the positions wrap.
            for piece in bytes.chunks(NONE as usize - 1) {
                self.word(piece, s, out);
            }
            return;
        }
        let n = bytes.len();
        s.syms.clear();
        s.heap.clear();
        s.syms.extend(bytes.iter().enumerate().map(|(i, &b)| Sym {
            id: self.byte_sym[b as usize],
            len: 1,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i + 1 == n { NONE } else { i as u32 + 1 },
        }));
        for i in 1..n {
            self.queue(s, i as u32 - 1, i as u32);
        }
        while let Some(Reverse((_, left, right, lsym, rsym))) = s.heap.pop() {
            let (l, r) = (s.syms[left as usize], s.syms[right as usize]);
            if l.len == 0 || r.len == 0 || l.id != lsym || r.id != rsym {
                continue; // stale: a side was merged since this pair was queued
            }
            let (_, merged) = self.merges[&key(lsym, rsym)];
            let sl = &mut s.syms[left as usize];
            sl.id = merged;
            sl.len += r.len;
            sl.next = r.next;
            s.syms[right as usize].len = 0;
            if r.next != NONE {
                s.syms[r.next as usize].prev = left;
            }
            if l.prev != NONE {
                self.queue(s, l.prev, left);
            }
            if r.next != NONE {
                self.queue(s, left, r.next);
            }
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            let sym = s.syms[i as usize];
            match self.sym_token[sym.id as usize] {
                Some(t) => out.push(t),
                // Not a token: its single-byte-character tokens, skipping missing ones.
                None => out.extend(
                    self.sym_text[sym.id as usize]
                        .bytes()
                        .filter_map(|b| self.ascii_token.get(b as usize).copied().flatten()),
                ),
            }
            i = sym.next;
        }
    }

    fn queue(&self, s: &mut Scratch, left: u32, right: u32) {
        let (lsym, rsym) = (s.syms[left as usize].id, s.syms[right as usize].id);
        if let Some(&(rank, _)) = self.merges.get(&key(lsym, rsym)) {
            s.heap.push(Reverse((rank, left, right, lsym, rsym)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tokens: &[&str], merges: &[&str], word: &str) -> Vec<u32> {
        let t: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
        let m: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
        let bpe = Bpe::new(&t, &m);
        let mut out = Vec::new();
        bpe.word(word.as_bytes(), &mut Scratch::default(), &mut out);
        out
    }

    #[test]
    fn merges_follow_rank_then_position() {
        let vocab = ["a", "b", "c", "ab", "bc", "abc", "aa"];
        assert_eq!(run(&vocab, &["b c", "a b", "a bc"], "abc"), [5]);
        assert_eq!(run(&vocab, &["a b", "b c", "a bc"], "abc"), [3, 2]);
        // Equal ranks: the left pair first; the overlapping right one is then stale.
        assert_eq!(run(&vocab, &["a a"], "aaa"), [6, 0]);
        assert_eq!(run(&vocab, &["a a"], "aaaa"), [6, 6]);
        // A merged symbol missing from the vocabulary falls back to its one-byte tokens.
        assert_eq!(run(&["a", "b"], &["a b"], "ab"), [0, 1]);
        // Entries without a separating space are ignored; a repeated pair keeps its first rank.
        assert_eq!(
            run(&vocab, &["ab", "b c", "a b", "b c", "a bc"], "abc"),
            [5]
        );
        // Bytes become byte-characters: a space is `Ġ`.
        assert_eq!(run(&["Ġ", "x", "Ġx"], &["Ġ x"], " x"), [2]);
        assert_eq!(run(&vocab, &[], ""), [] as [u32; 0]);
    }
}
