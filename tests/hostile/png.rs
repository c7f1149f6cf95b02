//! Hostile PNG files.

use super::Case;

pub const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

pub fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

pub fn ihdr(
    w: u32,
    h: u32,
    depth: u8,
    color: u8,
    compression: u8,
    filter: u8,
    interlace: u8,
) -> Vec<u8> {
    let mut b = w.to_be_bytes().to_vec();
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[depth, color, compression, filter, interlace]);
    b
}

/// zlib "stored" (uncompressed) stream of `data` (Adler-32 included).
pub fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![&[][..]]
    } else {
        data.chunks(65535).collect()
    };
    for (i, c) in chunks.iter().enumerate() {
        out.push(u8::from(i + 1 == chunks.len()));
        out.extend_from_slice(&(c.len() as u16).to_le_bytes());
        out.extend_from_slice(&(!(c.len() as u16)).to_le_bytes());
        out.extend_from_slice(c);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    out.extend_from_slice(&(b << 16 | a).to_be_bytes());
    out
}

/// A complete PNG with the given IHDR body and raw (filtered) scanlines.
pub fn png_with(ihdr_body: &[u8], raw: &[u8], extra: &[(&[u8; 4], Vec<u8>)]) -> Vec<u8> {
    let mut out = SIGNATURE.to_vec();
    chunk(&mut out, b"IHDR", ihdr_body);
    for (k, b) in extra {
        chunk(&mut out, k, b);
    }
    chunk(&mut out, b"IDAT", &zlib_stored(raw));
    chunk(&mut out, b"IEND", &[]);
    out
}

/// A valid 3x2 RGB8 image with a tEXt chunk.
pub fn good_png() -> Vec<u8> {
    let mut raw = Vec::new();
    for y in 0..2u8 {
        raw.push(0);
        for x in 0..3u8 {
            raw.extend_from_slice(&[x * 40, y * 90, 7]);
        }
    }
    png_with(
        &ihdr(3, 2, 8, 2, 0, 0, 0),
        &raw,
        &[(b"tEXt", b"parameters\0a cat".to_vec())],
    )
}

/// Expected outcome of decoding a PNG case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PngErr {
    Decode,
    TooLarge,
    /// Decode or TooLarge (the decoder may refuse a size before our own check does).
    DecodeOrTooLarge,
}

pub fn cases() -> Vec<(Case, PngErr)> {
    use PngErr::*;
    let mut v = Vec::new();
    let good = good_png();
    for (i, sig) in [
        &b""[..],
        b"\x89PNG",
        b"GIF89a",
        b"\x89PNG\r\n\x1a\x0a"[..7].as_ref(),
        b"\x89png\r\n\x1a\n",
        b"\x89PNG\n\r\x1a\n",
    ]
    .iter()
    .enumerate()
    {
        let mut b = sig.to_vec();
        if sig.len() >= 7 {
            b.extend_from_slice(&good[8..]);
        }
        v.push((Case::new("png_bad_signature", format!("#{i}"), b), Decode));
    }
    for cut in 8..good.len() - 12 {
        v.push((
            Case::new("png_truncated", format!("cut {cut}"), good[..cut].to_vec()),
            Decode,
        ));
    }
    for (w, h) in [(0u32, 2u32), (3, 0), (0, 0)] {
        v.push((
            Case::new(
                "png_zero_size",
                format!("{w}x{h}"),
                png_with(&ihdr(w, h, 8, 2, 0, 0, 0), &[0; 16], &[]),
            ),
            Decode,
        ));
    }
    for (w, h) in [
        (100_000u32, 100_000u32),
        (16_385, 1),
        (1, 16_385),
        (16_384, 16_384 + 1),
    ] {
        v.push((
            Case::new(
                "png_too_large",
                format!("{w}x{h}"),
                png_with(&ihdr(w, h, 8, 2, 0, 0, 0), &[0; 16], &[]),
            ),
            TooLarge,
        ));
    }
    for (w, h) in [
        (u32::MAX, 1u32),
        (1 << 31, 1 << 31),
        (0x7fff_ffff, 0x7fff_ffff),
    ] {
        v.push((
            Case::new(
                "png_too_large",
                format!("{w}x{h}"),
                png_with(&ihdr(w, h, 8, 2, 0, 0, 0), &[0; 16], &[]),
            ),
            DecodeOrTooLarge,
        ));
    }
    for (depth, color) in [
        (3u8, 0u8),
        (5, 2),
        (16, 3),
        (1, 2),
        (4, 6),
        (8, 1),
        (8, 5),
        (8, 7),
        (0, 0),
        (32, 2),
    ] {
        v.push((
            Case::new(
                "png_bad_ihdr",
                format!("depth {depth} color {color}"),
                png_with(&ihdr(3, 2, depth, color, 0, 0, 0), &[0; 32], &[]),
            ),
            Decode,
        ));
    }
    for (c, f, i) in [(1u8, 0u8, 0u8), (0, 1, 0), (0, 0, 2), (255, 255, 255)] {
        v.push((
            Case::new(
                "png_bad_ihdr",
                format!("compression {c} filter {f} interlace {i}"),
                png_with(&ihdr(3, 2, 8, 2, c, f, i), &[0; 32], &[]),
            ),
            Decode,
        ));
    }
    // IHDR CRC corrupted, IHDR of the wrong length, missing IHDR, palette image without PLTE.
    let mut bad_crc = good.clone();
    bad_crc[29] ^= 0x40;
    v.push((Case::new("png_bad_crc", "IHDR crc", bad_crc), Decode));
    let mut short = SIGNATURE.to_vec();
    chunk(&mut short, b"IHDR", &ihdr(3, 2, 8, 2, 0, 0, 0)[..12]);
    chunk(&mut short, b"IEND", &[]);
    v.push((Case::new("png_bad_ihdr", "IHDR 12 bytes", short), Decode));
    let mut no_ihdr = SIGNATURE.to_vec();
    chunk(&mut no_ihdr, b"IDAT", &zlib_stored(&[0; 10]));
    chunk(&mut no_ihdr, b"IEND", &[]);
    v.push((Case::new("png_bad_ihdr", "no IHDR", no_ihdr), Decode));
    v.push((
        Case::new(
            "png_bad_palette",
            "no PLTE",
            png_with(&ihdr(3, 2, 8, 3, 0, 0, 0), &[0; 8], &[]),
        ),
        Decode,
    ));
    // PLTE lengths that are not whole RGB entries, empty, or over 256 entries (the png crate
    // panicked on the first kind: fuzz finding).
    for (len, color, depth) in [
        (1usize, 3u8, 8u8),
        (2, 3, 8),
        (4, 3, 8),
        (28, 3, 2),
        (28, 2, 8),
        (0, 3, 8),
        (771, 3, 8),
        (1000, 3, 8),
    ] {
        let plte: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let raw = vec![0u8; 64];
        let name = format!("PLTE {len} bytes, color {color} depth {depth}");
        v.push((
            Case::new(
                "png_bad_palette",
                name,
                png_with(&ihdr(3, 2, depth, color, 0, 0, 0), &raw, &[(b"PLTE", plte)]),
            ),
            Decode,
        ));
    }
    // Pixel data: too little, bad filter type, corrupt zlib, no IDAT.
    v.push((
        Case::new(
            "png_bad_data",
            "short IDAT",
            png_with(&ihdr(3, 2, 8, 2, 0, 0, 0), &[0; 5], &[]),
        ),
        Decode,
    ));
    v.push((
        Case::new(
            "png_bad_data",
            "filter 9",
            png_with(&ihdr(3, 2, 8, 2, 0, 0, 0), &[9; 20], &[]),
        ),
        Decode,
    ));
    let mut bad_zlib = SIGNATURE.to_vec();
    chunk(&mut bad_zlib, b"IHDR", &ihdr(3, 2, 8, 2, 0, 0, 0));
    chunk(
        &mut bad_zlib,
        b"IDAT",
        &[0x78, 0x9c, 0xff, 0xff, 0xff, 0x00],
    );
    chunk(&mut bad_zlib, b"IEND", &[]);
    v.push((Case::new("png_bad_data", "corrupt zlib", bad_zlib), Decode));
    let mut no_idat = SIGNATURE.to_vec();
    chunk(&mut no_idat, b"IHDR", &ihdr(3, 2, 8, 2, 0, 0, 0));
    chunk(&mut no_idat, b"IEND", &[]);
    v.push((Case::new("png_bad_data", "no IDAT", no_idat), Decode));
    // Chunk length fields past the end.
    for len in [u32::MAX, 0x7fff_ffff, 0x8000_0000, 1000] {
        let mut b = good.clone();
        b[33..37].copy_from_slice(&len.to_be_bytes());
        v.push((
            Case::new("png_chunk_len_huge", format!("len {len}"), b),
            Decode,
        ));
    }
    v
}

/// Cases for the text-chunk reader (`-M metadata`), which walks chunks itself.
pub fn text_cases() -> Vec<Case> {
    let good = good_png();
    let mut v = Vec::new();
    for cut in 0..good.len() {
        v.push(Case::new(
            "png_text_truncated",
            format!("cut {cut}"),
            good[..cut].to_vec(),
        ));
    }
    for len in [u32::MAX, 0x7fff_ffff, 1000] {
        let mut b = good.clone();
        b[33..37].copy_from_slice(&len.to_be_bytes());
        v.push(Case::new("png_text_chunk_len", format!("len {len}"), b));
    }
    v
}
