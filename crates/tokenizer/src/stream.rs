//! Streaming detokenization: token pieces are bytes, and a UTF-8 character may span several
//! tokens (`ĠðŁ` = 20 F0 9F starts an emoji the next two tokens finish). The decoder hands out
//! only complete characters and holds back an incomplete tail until the bytes that finish it
//! arrive; bytes that can never form a character become U+FFFD.

use crate::{Result, Tokenizer};

/// Turns tokens into text as they are generated.
///
/// ```no_run
/// # fn demo(tok: &tokenizer::Tokenizer) -> tokenizer::Result<()> {
/// let mut stream = tok.stream(false);
/// let mut text = String::new();
/// for id in [19556, 905] {
///     text.push_str(&stream.push(id)?);
/// }
/// text.push_str(&stream.finish());
/// assert_eq!(text, "Hello world");
/// # Ok(()) }
/// ```
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, render_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            render_special,
            pending: Vec::new(),
        }
    }

    /// Adds token `id`; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let piece = self.tokenizer.piece(id, self.render_special)?;
        Ok(self.push_bytes(piece))
    }

    /// Adds raw bytes; returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: keep it for later.
                        None => {
                            rest = bad;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Bytes held back (an incomplete character).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back, with U+FFFD for an unfinished character.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
