//! A byte-level BPE tokenizer (GPT-2 style) built from a GGUF file's `tokenizer.ggml.*`
//! metadata, producing the same ids as llama.cpp's `llama_tokenize` for the `smollm`
//! pre-tokenizer, and turning ids back into bytes and text.
//!
//! The pipeline, as llama.cpp runs it:
//! 1. **special-token partition** (module `special`): literal occurrences of special tokens are cut
//!    out first (CONTROL tokens only with `parse_special`);
//! 2. **pre-tokenizer** (module `pretok`): every number code point alone, then the GPT-2 pattern
//!    inside each piece with llama.cpp's whitespace-run rule;
//! 3. **byte-to-unicode** (module `bytes`) and **BPE merges by rank** (module `bpe`) per word;
//! 4. **detokenization**: NORMAL tokens back through the inverse byte map, CONTROL tokens as
//!    nothing or as their text; [`StreamDecoder`] holds back a character split across tokens.
//!
//! Why hand-written and not the `tokenizers` crate (which the MiniLM example uses): its BPE
//! model could be built from the vocabulary and merges, and a `Sequence[Digits(individual),
//! ByteLevel]` pre-tokenizer comes close to `smollm`; but the parts that decide the ids here
//! are llama.cpp's own — which tokens the special partition considers and when, the
//! single-byte fallback for merged symbols missing from the vocabulary, the character tables
//! (its whitespace list, L*/N* categories), and rendering of control tokens — and each would
//! have to be re-done or verified around the crate anyway, for a large dependency tree in
//! exchange for ~150 lines of merging. Writing the three small stages directly keeps every
//! rule next to the llama.cpp behaviour it reproduces and checkable against its goldens. The
//! Unicode categories come from the maintained `unicode-general-category` crate.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = tokenizer::Tokenizer::from_gguf(file.metadata())?;
//! assert_eq!(tok.tokenize("Hello world", true, false), [19556, 905]);
//! let chat = "<|im_start|>user\nHi<|im_end|>";
//! assert_eq!(tok.tokenize(chat, true, true), [1, 4093, 198, 26843, 2]);
//! assert_eq!(tok.detokenize(&[1, 4093], true)?, b"<|im_start|>user");
//! assert_eq!(tok.detokenize(&[1, 4093], false)?, b"user");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod bytes;
mod error;
mod pretok;
mod special;
mod stream;

use std::collections::HashMap;

pub use error::{Result, TokenizerError};
pub use stream::StreamDecoder;

/// A token's kind (`tokenizer.ggml.token_type`, llama.cpp's `llama_token_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    fn from_i32(v: i32) -> Option<Self> {
        use TokenType::*;
        Some(match v {
            0 => Undefined,
            1 => Normal,
            2 => Unknown,
            3 => Control,
            4 => UserDefined,
            5 => Unused,
            6 => Byte,
            _ => return None,
        })
    }
}

/// Texts llama.cpp (at the reference commit) treats as end of generation wherever they
/// appear in a vocabulary: end of turn / text / message, and the FIM pad, repository and
/// file-separator markers it auto-detects. Such a token is also made a control token.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
    // FIM pad, repository, file separator.
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// A byte-level BPE tokenizer with the `smollm` pre-tokenizer.
pub struct Tokenizer {
    texts: Vec<String>,
    types: Vec<TokenType>,
    /// What each token detokenizes to when special tokens are rendered.
    pieces: Vec<Box<[u8]>>,
    ids: HashMap<String, u32>,
    /// Partition candidates, longest text first: (id, text, parsed even without parse_special).
    specials: Vec<(u32, Box<str>, bool)>,
    bpe: bpe::Bpe,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata: `tokenizer.ggml.model` (`gpt2`),
    /// `.pre` (`smollm`), `.tokens`, `.merges`, and optionally `.token_type` (default all
    /// NORMAL), `.bos_token_id`, `.eos_token_id`, `.eot_token_id`, `.add_bos_token`,
    /// `.add_eos_token` (both default false).
    pub fn from_gguf(meta: &gguf::Metadata) -> Result<Tokenizer> {
        let model = meta.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        let pre = meta.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
        if pre != "smollm" {
            return Err(TokenizerError::UnsupportedPre(pre.to_owned()));
        }
        let texts = meta.strings("tokenizer.ggml.tokens")?.to_vec();
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::BadVocab(format!("{n} tokens")));
        }
        let mut types: Vec<TokenType> = match meta.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(_) => {
                let raw = meta.i32s("tokenizer.ggml.token_type")?;
                if raw.len() != n {
                    return Err(TokenizerError::BadVocab(format!(
                        "{} token types for {n} tokens",
                        raw.len()
                    )));
                }
                raw.iter()
                    .map(|&v| {
                        TokenType::from_i32(v)
                            .ok_or_else(|| TokenizerError::BadVocab(format!("token type {v}")))
                    })
                    .collect::<Result<_>>()?
            }
        };
        let merges = meta.strings("tokenizer.ggml.merges")?;
        let id = |key: &str| -> Result<Option<u32>> {
            match meta.opt_u32(key)? {
                Some(v) if v as usize >= n => Err(TokenizerError::BadVocab(format!(
                    "{key} = {v} is outside the {n} tokens"
                ))),
                v => Ok(v),
            }
        };
        let (bos, eos, eot) = (
            id("tokenizer.ggml.bos_token_id")?,
            id("tokenizer.ggml.eos_token_id")?,
            id("tokenizer.ggml.eot_token_id")?,
        );
        let add_bos = meta
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false);
        let add_eos = meta
            .opt_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);

        let mut ids = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let mut eog: Vec<u32> = eos.into_iter().chain(eot).collect();
        for t in EOG_TEXTS {
            if let Some(&id) = ids.get(*t) {
                eog.push(id);
                if types[id as usize] == TokenType::Normal {
                    types[id as usize] = TokenType::Control;
                }
            }
        }
        eog.sort_unstable();
        eog.dedup();
        let pieces = texts
            .iter()
            .zip(&types)
            .map(|(t, ty)| match ty {
                TokenType::Normal => decode_normal(t),
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    t.as_bytes().into()
                }
                _ => Box::default(),
            })
            .collect();
        let mut specials: Vec<(u32, Box<str>, bool)> = types
            .iter()
            .enumerate()
            .filter(|(_, ty)| {
                matches!(
                    ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .map(|(i, ty)| {
                (
                    i as u32,
                    texts[i].as_str().into(),
                    *ty == TokenType::UserDefined,
                )
            })
            .collect();
        specials.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let bpe = bpe::Bpe::new(&texts, merges);
        tracing::debug!(n_vocab = n, merges = merges.len(), ?eog, "tokenizer built");
        Ok(Tokenizer {
            texts,
            types,
            pieces,
            ids,
            specials,
            bpe,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
        })
    }

    /// Token ids of `text` (`llama_tokenize`). `add_special` adds BOS/EOS where the model asks
    /// for them (`add_bos_token` / `add_eos_token`; SmolLM2 asks for neither);
    /// `parse_special` turns literal control-token texts like `<|im_start|>` into their ids
    /// (otherwise they are tokenized as plain text).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut words = Vec::new();
        let mut scratch = bpe::Scratch::default();
        for frag in special::partition(text, &self.specials, parse_special) {
            match frag {
                special::Fragment::Token(id) => out.push(id),
                special::Fragment::Text(a, b) => {
                    let piece = &text[a..b];
                    pretok::split(piece, &mut words, |x, y| {
                        self.bpe
                            .word(&piece.as_bytes()[x..y], &mut scratch, &mut out);
                    });
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The bytes token `id` stands for (`llama_token_to_piece`): a NORMAL token's text through
    /// the inverse byte map; a CONTROL (or UNKNOWN) token's literal text if `render_special`,
    /// else nothing; a USER_DEFINED token's text; nothing for other kinds.
    pub fn piece(&self, id: u32, render_special: bool) -> Result<&[u8]> {
        let ty = self.token_type(id)?;
        if !render_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
            return Ok(&[]);
        }
        Ok(&self.pieces[id as usize])
    }

    /// The bytes of `ids` (`llama_detokenize` with `remove_special = false`; no space clean-up,
    /// as `smollm` has none). May end inside a UTF-8 character if the ids do.
    pub fn detokenize(&self, ids: &[u32], render_special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.piece(id, render_special)?);
        }
        Ok(out)
    }

    /// [`Tokenizer::detokenize`] as text, with U+FFFD for bytes that are not UTF-8.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize(ids, render_special)?).into_owned())
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// Token `id`'s vocabulary text (byte-characters for NORMAL tokens).
    pub fn token_text(&self, id: u32) -> Result<&str> {
        self.check(id).map(|i| self.texts[i].as_str())
    }

    /// Token `id`'s kind.
    pub fn token_type(&self, id: u32) -> Result<TokenType> {
        self.check(id).map(|i| self.types[i])
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Beginning-of-sequence id, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence id, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `tokenize(…, add_special = true, …)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `tokenize(…, add_special = true, …)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// End-of-generation ids, ascending: EOS, EOT and the tokens llama.cpp recognises by text.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Whether generation stops at `id`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    fn check(&self, id: u32) -> Result<usize> {
        let i = id as usize;
        if i < self.texts.len() {
            Ok(i)
        } else {
            Err(TokenizerError::BadToken {
                id,
                n_vocab: self.texts.len(),
            })
        }
    }
}

/// A NORMAL token's bytes: each code point through the inverse byte map. A code point outside
/// the map (none in a GPT-2 vocabulary) becomes llama.cpp's marker, `[UNK_BYTE_0x` + its UTF-8
/// in hex + the whole token text + `]`.
fn decode_normal(text: &str) -> Box<[u8]> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match bytes::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_tokens_decode_through_the_byte_map() {
        assert_eq!(&*decode_normal("ĠðŁ"), [0x20, 0xF0, 0x9F]);
        assert_eq!(&*decode_normal("ĊĊ"), b"\n\n");
        assert_eq!(&*decode_normal("a你"), b"a[UNK_BYTE_0xe4bda0a\xe4\xbd\xa0]");
    }
}
