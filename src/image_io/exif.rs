//! The EXIF `UserComment` A1111 stores generation parameters in (JPEG APP1, WebP `EXIF`):
//! a TIFF block whose IFD0 points to an Exif IFD holding tag 0x9286, text prefixed with
//! `UNICODE\0` and encoded UTF-16 (A1111 writes it big-endian through piexif, whatever the
//! block's byte order; some tools follow the block's), or `ASCII\0\0\0`.

/// Tag of IFD0's pointer to the Exif IFD.
const EXIF_IFD: u16 = 0x8769;
/// Tag of the Exif UserComment.
const USER_COMMENT: u16 = 0x9286;
const UNICODE: &[u8; 8] = b"UNICODE\0";
const ASCII: &[u8; 8] = b"ASCII\0\0\0";
/// Most IFD entries read (a hostile count cannot make us loop long).
const MAX_ENTRIES: usize = 512;

/// A big-endian TIFF block holding `text` as the Exif UserComment (UTF-16).
pub fn user_comment_block(text: &str) -> Vec<u8> {
    let mut comment = UNICODE.to_vec();
    comment.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
    // Header (8), IFD0 with one entry (18), the Exif IFD with one entry (18), the comment.
    let exif_ifd = 8 + 18u32;
    let data = exif_ifd + 18;
    let mut out = b"MM\0\x2a".to_vec();
    out.extend(8u32.to_be_bytes());
    for (ifd_tag, kind, count, value) in [
        (EXIF_IFD, 4u16, 1u32, exif_ifd),
        (USER_COMMENT, 7, comment.len() as u32, data),
    ] {
        out.extend(1u16.to_be_bytes());
        out.extend(ifd_tag.to_be_bytes());
        out.extend(kind.to_be_bytes());
        out.extend(count.to_be_bytes());
        out.extend(value.to_be_bytes());
        out.extend(0u32.to_be_bytes()); // no next IFD
    }
    out.extend(comment);
    out
}

/// Reads a TIFF block with the byte order its header says.
struct Tiff<'a> {
    bytes: &'a [u8],
    big: bool,
}

impl Tiff<'_> {
    fn u16_at(&self, at: usize) -> Option<u16> {
        let b: [u8; 2] = self.bytes.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        let b: [u8; 4] = self.bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    /// The (count, value/offset field position) of `tag` in the IFD at `ifd`.
    fn find(&self, ifd: usize, tag: u16) -> Option<(usize, usize)> {
        let n = (self.u16_at(ifd)? as usize).min(MAX_ENTRIES);
        (0..n).find_map(|i| {
            let e = ifd + 2 + 12 * i;
            (self.u16_at(e)? == tag).then(|| Some((self.u32_at(e + 4)? as usize, e + 8)))?
        })
    }
}

/// The UserComment of a TIFF block (with or without JPEG's `Exif\0\0` prefix), if any.
pub fn read_user_comment(block: &[u8]) -> Option<String> {
    let bytes = block.strip_prefix(b"Exif\0\0").unwrap_or(block);
    let big = match bytes.get(..4)? {
        b"MM\0\x2a" => true,
        b"II\x2a\0" => false,
        _ => return None,
    };
    let tiff = Tiff { bytes, big };
    let ifd0 = tiff.u32_at(4)? as usize;
    let (_, at) = tiff.find(ifd0, EXIF_IFD)?;
    let exif = tiff.u32_at(at)? as usize;
    let (count, at) = tiff.find(exif, USER_COMMENT)?;
    let data = if count <= 4 {
        bytes.get(at..at + count)?
    } else {
        let off = tiff.u32_at(at)? as usize;
        bytes.get(off..off.checked_add(count)?)?
    };
    let (prefix, text) = (data.get(..8)?, &data[8..]);
    Some(if prefix == UNICODE {
        // piexif (A1111) writes UTF-16BE whatever the block's byte order, others follow the
        // block: mostly-ASCII text tells by where its zero bytes sit.
        let zeros = |parity: usize| {
            text.iter()
                .skip(parity)
                .step_by(2)
                .filter(|&&b| b == 0)
                .count()
        };
        let be = match zeros(0).cmp(&zeros(1)) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => big,
        };
        let units: Vec<u16> = text
            .chunks_exact(2)
            .map(|c| {
                if be {
                    u16::from_be_bytes([c[0], c[1]])
                } else {
                    u16::from_le_bytes([c[0], c[1]])
                }
            })
            .collect();
        String::from_utf16_lossy(&units)
    } else if prefix == ASCII {
        String::from_utf8_lossy(text).into_owned()
    } else {
        String::from_utf8_lossy(text)
            .trim_end_matches('\0')
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_comment_round_trip() {
        let text = "a cat <lora:x:1>, ünïcode ✓\nSteps: 20";
        let block = user_comment_block(text);
        assert_eq!(read_user_comment(&block).as_deref(), Some(text));
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend(&block);
        assert_eq!(read_user_comment(&app1).as_deref(), Some(text));
    }

    #[test]
    fn hostile_blocks_give_none() {
        let block = user_comment_block("hello");
        for cut in 0..block.len() {
            let _ = read_user_comment(&block[..cut]);
        }
        assert_eq!(read_user_comment(b"MM\0\x2a\xff\xff\xff\xff"), None);
        assert_eq!(read_user_comment(b"nonsense"), None);
        // A count that claims more than the block holds.
        let mut bad = block.clone();
        let at = 8 + 18 + 2 + 4;
        bad[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(read_user_comment(&bad), None);
    }
}
