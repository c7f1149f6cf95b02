//! Does a found tokenizer belong to these T5 / umT5 weights?
//!
//! The embedding table is the tokenizer's vocabulary padded up a little (T5 v1.1: 32100 →
//! 32128; umT5: 256300 → 256384). Any tokenizer fits ids-wise into a larger table, so the wrong
//! one (T5's beside umT5 weights) would silently give garbage: compare the sizes instead.

use crate::tokenizers::{T5Tokenizer, TokenizerError};

use super::T5Encoder;

/// At most this fraction of the embedding rows may lie beyond the tokenizer's ids (the padding
/// is well under 1% for every released checkpoint; the wrong family is off by 8x).
const MAX_UNUSED_FRACTION: usize = 8;

/// What to download for each family, as the error tells the user.
const T5_TOKENIZER: &str = "spiece.model (or tokenizer.json) of google/t5-v1_1-xxl";
const UMT5_TOKENIZER: &str = "tokenizer.json (or spiece.model) of google/umt5-xxl";

/// Checks that `tokenizer` (read from `origin`) matches the encoder's embedding table; the
/// error names the tokenizer to download and `--t5xxl-tokenizer`.
pub fn check_tokenizer(
    model: &T5Encoder,
    tokenizer: &T5Tokenizer,
    origin: &str,
) -> Result<(), TokenizerError> {
    check_tokenizer_size(
        model.config().vocab,
        model.is_umt5(),
        tokenizer.model().len(),
        origin,
    )
}

/// [`check_tokenizer`] on bare sizes: `vocab_rows` embedding rows, `umt5` whether the encoder
/// has a position table per block, `tokenizer_len` the tokenizer's id count.
pub fn check_tokenizer_size(
    vocab_rows: usize,
    umt5: bool,
    tokenizer_len: usize,
    origin: &str,
) -> Result<(), TokenizerError> {
    let fits = tokenizer_len <= vocab_rows
        && vocab_rows - tokenizer_len <= vocab_rows / MAX_UNUSED_FRACTION;
    if fits {
        return Ok(());
    }
    let (family, wanted) = if umt5 {
        ("umT5", UMT5_TOKENIZER)
    } else {
        ("T5", T5_TOKENIZER)
    };
    Err(TokenizerError::Vocab {
        origin: origin.to_string(),
        reason: format!(
            "it has {tokenizer_len} tokens but the {family} text encoder's embedding has \
             {vocab_rows} rows, so it is not this encoder's tokenizer; download the {wanted} \
             and pass its path with --t5xxl-tokenizer <FILE>"
        ),
    })
}
