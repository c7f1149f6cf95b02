//! Video output (`sd_cli::image_io::video`): synthetic frames written as `.avi`, `.webm`,
//! animated `.webp` and `%d` image sequences, read back by independent code: a RIFF walker
//! written here plus the `image` crate's JPEG decoder for AVI (within JPEG loss: PSNR >= 30 dB
//! per frame), an EBML walker written here plus the `image` crate's VP8 decoder for WebM
//! (within VP8 loss: PSNR >= 30 dB per frame), the `image` crate's animated WebP decoder
//! (lossless: exact), and the `png` crate for sequences (exact). Then the error cases.

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use image::AnimationDecoder;
use sd_cli::image_io::audio::{read_wav, Audio};
use sd_cli::image_io::video::{
    is_video_path, soundtrack_path, video_output_path, write_video, write_video_with_audio,
    VideoError, VideoFormat,
};
use sd_cli::image_io::{read_text_metadata, Channels, Image};

/// Smallest PSNR accepted for a JPEG (quality 90) frame of the smooth test gradients.
const JPEG_PSNR_FLOOR: f64 = 30.0;
const TEXT: &str = "a cat <on> a mat & \"more\"\nNegative prompt: dog\nSteps: 20, Seed: 42";

/// `n` frames of `w`×`h`: smooth gradients, shifted per frame so each frame is distinct.
fn frames(n: usize, w: u32, h: u32) -> Vec<Image> {
    (0..n)
        .map(|f| {
            let mut data = Vec::with_capacity((w * h * 3) as usize);
            for y in 0..h {
                for x in 0..w {
                    data.push((x * 180 / w + f as u32 * 15) as u8);
                    data.push((y * 200 / h + 20) as u8);
                    data.push((40 + f as u32 * 40 + (x + y) % 8) as u8);
                }
            }
            Image::new(w, h, Channels::Rgb, data).unwrap()
        })
        .collect()
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

/// What the RIFF walker below finds in an AVI.
#[derive(Default)]
struct Avi {
    avih: Vec<u8>,
    strh: Vec<u8>,
    strf: Vec<u8>,
    info: Vec<([u8; 4], Vec<u8>)>,
    /// Absolute offset of the `movi` FourCC.
    movi_at: usize,
    /// (absolute chunk offset, payload) of each `00dc`.
    frames: Vec<(usize, Vec<u8>)>,
    idx1: Vec<u8>,
}

/// Walks the chunks in `b[start..end]`, descending into `LIST`s.
fn walk(b: &[u8], start: usize, end: usize, list: &[u8], out: &mut Avi) {
    let mut pos = start;
    while pos + 8 <= end {
        let id: [u8; 4] = b[pos..pos + 4].try_into().unwrap();
        let size = le32(b, pos + 4) as usize;
        let body = pos + 8;
        assert!(body + size <= end, "chunk {:?} overruns its parent", id);
        let payload = &b[body..body + size];
        match &id {
            b"LIST" => {
                let kind = &payload[..4];
                if kind == b"movi" {
                    out.movi_at = body;
                }
                walk(b, body + 4, body + size, kind, out);
            }
            b"avih" => out.avih = payload.to_vec(),
            b"strh" => out.strh = payload.to_vec(),
            b"strf" => out.strf = payload.to_vec(),
            b"00dc" => out.frames.push((pos, payload.to_vec())),
            b"idx1" => out.idx1 = payload.to_vec(),
            _ if list == b"INFO" => out.info.push((id, payload.to_vec())),
            _ => {}
        }
        pos = body + size + (size & 1);
    }
    assert_eq!(pos, end, "chunks do not tile their parent exactly");
}

fn read_avi(path: &Path) -> Avi {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..4], b"RIFF");
    assert_eq!(&b[8..12], b"AVI ");
    assert_eq!(le32(&b, 4) as usize + 8, b.len(), "RIFF size");
    let mut avi = Avi::default();
    walk(&b, 12, b.len(), b"AVI ", &mut avi);
    avi
}

fn check_avi(dir: &Path, name: &str, w: u32, h: u32, fps: u32, text: Option<&str>) {
    let path = dir.join(name);
    let src = frames(5, w, h);
    let written = write_video(&path, &src, fps, text, 0).unwrap();
    assert_eq!(written, vec![path.clone()]);
    let avi = read_avi(&path);

    // avih: µs per frame, flags (has index), frames, streams, size.
    assert_eq!(avi.avih.len(), 56);
    assert_eq!(
        le32(&avi.avih, 0),
        (1_000_000.0 / fps as f64).round() as u32
    );
    assert_ne!(le32(&avi.avih, 12) & 0x10, 0, "AVIF_HASINDEX");
    assert_eq!(le32(&avi.avih, 16), 5);
    assert_eq!(le32(&avi.avih, 24), 1);
    assert_eq!((le32(&avi.avih, 32), le32(&avi.avih, 36)), (w, h));
    // strh: vids/MJPG, rate/scale = fps, length in frames.
    assert_eq!(avi.strh.len(), 56);
    assert_eq!(&avi.strh[..8], b"vidsMJPG");
    // dwRate (24) / dwScale (20) = fps.
    assert_eq!(
        le32(&avi.strh, 24) as f64 / le32(&avi.strh, 20) as f64,
        fps as f64
    );
    assert_eq!(le32(&avi.strh, 32), 5);
    assert!(le32(&avi.strh, 36) as usize >= avi.frames.iter().map(|f| f.1.len()).max().unwrap());
    // strf: BITMAPINFOHEADER.
    assert_eq!(avi.strf.len(), 40);
    assert_eq!(le32(&avi.strf, 0), 40);
    assert_eq!((le32(&avi.strf, 4), le32(&avi.strf, 8)), (w, h));
    assert_eq!(le16(&avi.strf, 14), 24);
    assert_eq!(&avi.strf[16..20], b"MJPG");

    // idx1: one keyframe entry per 00dc, offsets from the movi FourCC.
    assert_eq!(avi.frames.len(), 5);
    assert_eq!(avi.idx1.len(), 5 * 16);
    for (i, (at, data)) in avi.frames.iter().enumerate() {
        let e = &avi.idx1[i * 16..(i + 1) * 16];
        assert_eq!(&e[..4], b"00dc");
        assert_ne!(le32(e, 4) & 0x10, 0, "AVIIF_KEYFRAME");
        assert_eq!(
            avi.movi_at + le32(e, 8) as usize,
            *at,
            "idx1 offset of frame {i}"
        );
        assert_eq!(le32(e, 12) as usize, data.len());

        let img = image::load_from_memory_with_format(data, image::ImageFormat::Jpeg)
            .unwrap()
            .to_rgb8();
        assert_eq!(img.dimensions(), (w, h));
        let p = psnr(img.as_raw(), &src[i].data);
        assert!(p >= JPEG_PSNR_FLOOR, "{name} frame {i}: PSNR {p:.1} dB");
    }

    let info: Vec<_> = avi.info.iter().map(|(id, v)| (*id, v.clone())).collect();
    match text {
        Some(t) => {
            let icmt = info.iter().find(|(id, _)| id == b"ICMT").expect("ICMT");
            assert_eq!(icmt.1, [t.as_bytes(), b"\0"].concat());
            assert!(info
                .iter()
                .any(|(id, v)| id == b"ISFT" && v.starts_with(b"sd-cli")));
        }
        None => assert!(info.is_empty(), "no INFO list without metadata"),
    }
}

#[test]
fn avi_is_mjpeg_with_index_and_info() {
    let dir = tempfile::tempdir().unwrap();
    check_avi(dir.path(), "even.avi", 48, 32, 16, Some(TEXT));
    check_avi(dir.path(), "odd.AVI", 47, 31, 24, None);
    check_avi(dir.path(), "slow.avi", 48, 32, 7, Some("x"));
    no_temp_files(dir.path());
}

fn check_webp(dir: &Path, name: &str, w: u32, h: u32, fps: u32, text: Option<&str>) {
    let path = dir.join(name);
    let src = frames(5, w, h);
    write_video(&path, &src, fps, text, 0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..4], b"RIFF");
    assert_eq!(le32(&bytes, 4) as usize + 8, bytes.len());
    assert_eq!(&bytes[8..16], b"WEBPVP8X");
    assert_ne!(bytes[20] & 0x02, 0, "VP8X animation flag");
    // ANIM right after VP8X: loop count 0 (forever).
    assert_eq!(&bytes[30..34], b"ANIM");
    assert_eq!(le16(&bytes, 42), 0);

    let dec = image::codecs::webp::WebPDecoder::new(Cursor::new(bytes)).unwrap();
    assert!(dec.has_animation());
    let got = dec.into_frames().collect_frames().unwrap();
    assert_eq!(got.len(), 5);
    let want_ms = (1000.0 / fps as f64).round() as u32;
    for (i, f) in got.iter().enumerate() {
        let (num, den) = f.delay().numer_denom_ms();
        assert_eq!(num / den, want_ms, "{name} frame {i} duration");
        assert_eq!(f.buffer().dimensions(), (w, h));
        let rgb: Vec<u8> = f
            .buffer()
            .pixels()
            .flat_map(|p| {
                assert_eq!(p.0[3], 255, "opaque");
                [p.0[0], p.0[1], p.0[2]]
            })
            .collect();
        assert!(rgb == src[i].data, "{name} frame {i} is not exact");
    }

    let meta = read_text_metadata(&path).unwrap().1;
    match text {
        Some(t) => {
            assert!(
                meta.iter().filter(|c| c.keyword == "parameters").count() >= 1,
                "{meta:?}"
            );
            assert!(meta.iter().all(|c| c.text == t), "{meta:?}");
        }
        None => assert!(meta.is_empty(), "{meta:?}"),
    }
}

#[test]
fn animated_webp_is_lossless_with_durations() {
    let dir = tempfile::tempdir().unwrap();
    check_webp(dir.path(), "even.webp", 48, 32, 16, Some(TEXT));
    check_webp(dir.path(), "odd.WebP", 47, 31, 24, None);
    check_webp(dir.path(), "one_fps.webp", 48, 32, 1, None);
    no_temp_files(dir.path());
}

/// Decodes a PNG with the `png` crate: (RGB pixels, `parameters` text if any).
fn read_png(path: &Path) -> (u32, u32, Vec<u8>, Option<String>) {
    let mut dec = png::Decoder::new(std::fs::File::open(path).unwrap())
        .read_info()
        .unwrap();
    let mut buf = vec![0; dec.output_buffer_size()];
    let info = dec.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    let text = dec
        .info()
        .uncompressed_latin1_text
        .iter()
        .find(|t| t.keyword == "parameters")
        .map(|t| t.text.clone());
    (info.width, info.height, buf, text)
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn no_temp_files(dir: &Path) {
    let left: Vec<_> = names(dir)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn png_sequence_is_numbered_and_exact() {
    let dir = tempfile::tempdir().unwrap();
    let src = frames(5, 47, 31);
    let pattern = dir.path().join("frames_%03d.png");
    let written = write_video(&pattern, &src, 16, Some("Steps: 20"), 0).unwrap();
    let want: Vec<PathBuf> = (0..5)
        .map(|i| dir.path().join(format!("frames_{i:03}.png")))
        .collect();
    assert_eq!(written, want);
    for (i, p) in want.iter().enumerate() {
        let (w, h, px, text) = read_png(p);
        assert_eq!((w, h), (47, 31));
        assert!(px == src[i].data, "frame {i} is not exact");
        assert_eq!(text.as_deref(), Some("Steps: 20"));
    }

    // `--output-begin-idx 1`, plain %d, an extension upstream cannot encode → PNG, no text.
    let sub = dir.path().join("b");
    std::fs::create_dir(&sub).unwrap();
    let written = write_video(&sub.join("f_%d.avi"), &src[..3], 8, None, 1).unwrap();
    assert_eq!(
        written,
        vec![
            sub.join("f_1.png"),
            sub.join("f_2.png"),
            sub.join("f_3.png")
        ]
    );
    assert_eq!(read_png(&written[2]).3, None);
    assert_eq!(
        names(&sub),
        ["f_1.png", "f_2.png", "f_3.png"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}

#[test]
fn jpeg_and_webp_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let src = frames(3, 48, 32);
    let jpgs = write_video(&dir.path().join("s_%02d.jpg"), &src, 16, Some(TEXT), 0).unwrap();
    assert_eq!(jpgs[2], dir.path().join("s_02.jpg"));
    for (i, p) in jpgs.iter().enumerate() {
        let img = image::open(p).unwrap().to_rgb8();
        let q = psnr(img.as_raw(), &src[i].data);
        assert!(q >= JPEG_PSNR_FLOOR, "jpeg {i}: PSNR {q:.1} dB");
        let meta = read_text_metadata(p).unwrap().1;
        assert!(meta.iter().any(|c| c.text == TEXT), "{meta:?}");
    }
    let webps = write_video(&dir.path().join("w_%d.webp"), &src, 16, Some(TEXT), 0).unwrap();
    for (i, p) in webps.iter().enumerate() {
        let img = image::open(p).unwrap().to_rgb8();
        assert!(img.as_raw() == &src[i].data, "webp {i} is not exact");
        let meta = read_text_metadata(p).unwrap().1;
        assert!(meta
            .iter()
            .any(|c| c.keyword == "parameters" && c.text == TEXT));
    }
    no_temp_files(dir.path());
}

#[test]
fn paths_and_formats() {
    assert_eq!(VideoFormat::of(Path::new("x.avi")), Some(VideoFormat::Avi));
    assert_eq!(
        VideoFormat::of(Path::new("x_%05d.jpg")),
        Some(VideoFormat::Sequence)
    );
    assert_eq!(VideoFormat::of(Path::new("x.gif")), None);
    assert!(is_video_path(Path::new("a/b.WEBM")));
    assert!(!is_video_path(Path::new("b_%d.png")));
    assert_eq!(
        video_output_path(Path::new("out.png")),
        PathBuf::from("out.avi")
    );
    assert_eq!(
        video_output_path(Path::new("out.webp")),
        PathBuf::from("out.webp")
    );
}

fn err(path: &Path, frames: &[Image], fps: u32) -> VideoError {
    write_video(path, frames, fps, None, 0).unwrap_err()
}

#[test]
fn errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let avi = dir.path().join("v.avi");
    let good = frames(2, 48, 32);

    let e = err(&avi, &[], 16);
    assert!(matches!(e, VideoError::NoFrames { .. }), "{e}");
    let e = err(&avi, &good, 0);
    assert!(matches!(e, VideoError::ZeroFps { .. }), "{e}");
    let mut mixed = good.clone();
    mixed.push(frames(1, 47, 32).remove(0));
    let e = err(&dir.path().join("v.webp"), &mixed, 16);
    assert!(
        matches!(
            e,
            VideoError::SizeMismatch {
                index: 2,
                width: 47,
                ..
            }
        ),
        "{e}"
    );
    let mut bad = good.clone();
    bad[1].data.pop();
    let e = err(&dir.path().join("s_%d.png"), &bad, 16);
    assert!(matches!(e, VideoError::BadFrame { index: 1, .. }), "{e}");
    let e = err(&dir.path().join("v.mp4"), &good, 16);
    assert!(matches!(e, VideoError::UnknownFormat { .. }), "{e}");
    assert!(e.to_string().contains(".webm"), "{e}");
    let missing = dir.path().join("no/such/dir/v.avi");
    let e = err(&missing, &good, 16);
    assert!(matches!(e, VideoError::Image(_)), "{e}");
    assert!(e.to_string().contains("v.avi"), "{e}");
    // Every message names its file; nothing was written.
    for e in [err(&avi, &[], 16), err(&avi, &good, 0)] {
        assert!(e.to_string().contains(&*avi.to_string_lossy()), "{e}");
    }
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
}

#[test]
fn rgba_frames_keep_alpha_in_webp_and_drop_it_in_avi() {
    let dir = tempfile::tempdir().unwrap();
    let rgba: Vec<Image> = frames(2, 9, 7)
        .into_iter()
        .map(|f| {
            let data = f
                .data
                .chunks_exact(3)
                .enumerate()
                .flat_map(|(i, p)| [p[0], p[1], p[2], (i * 3) as u8])
                .collect();
            Image::new(9, 7, Channels::Rgba, data).unwrap()
        })
        .collect();
    let path = dir.path().join("a.webp");
    write_video(&path, &rgba, 10, None, 0).unwrap();
    let dec =
        image::codecs::webp::WebPDecoder::new(Cursor::new(std::fs::read(&path).unwrap())).unwrap();
    let got = dec.into_frames().collect_frames().unwrap();
    for (f, want) in got.iter().zip(&rgba) {
        assert!(f.buffer().as_raw() == &want.data);
    }
    let avi = dir.path().join("a.avi");
    write_video(&avi, &rgba, 10, None, 0).unwrap();
    assert_eq!(read_avi(&avi).frames.len(), 2);
}

/// A WebM element: ID (marker bits kept), payload range.
#[derive(Debug, Clone)]
struct Element {
    id: u32,
    start: usize,
    end: usize,
}

/// An EBML variable-length integer at `at`: (value without the marker, length).
fn vint(b: &[u8], at: usize, keep_marker: bool) -> (u64, usize) {
    let len = b[at].leading_zeros() as usize + 1;
    assert!(len <= 8, "bad vint at {at}");
    let mut v = u64::from(b[at]);
    if !keep_marker {
        v &= (1u64 << (8 - len)) - 1;
    }
    for i in 1..len {
        v = (v << 8) | u64::from(b[at + i]);
    }
    (v, len)
}

/// The elements directly inside `b[start..end]`.
fn children(b: &[u8], start: usize, end: usize) -> Vec<Element> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let (id, il) = vint(b, at, true);
        let (size, sl) = vint(b, at + il, false);
        let body = at + il + sl;
        let stop = body + size as usize;
        assert!(stop <= end, "element {id:x} overruns its parent");
        out.push(Element {
            id: id as u32,
            start: body,
            end: stop,
        });
        at = stop;
    }
    assert_eq!(at, end);
    out
}

fn child(b: &[u8], parent: &Element, id: u32) -> Element {
    children(b, parent.start, parent.end)
        .into_iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("no element {id:x} in {:x}", parent.id))
}

fn be_uint(b: &[u8], e: &Element) -> u64 {
    b[e.start..e.end]
        .iter()
        .fold(0, |v, &x| (v << 8) | u64::from(x))
}

/// A VP8 key frame wrapped as a still WebP, decoded by the `image` crate to RGB.
fn decode_vp8(frame: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut riff = Vec::new();
    riff.extend_from_slice(b"RIFF");
    let padded = frame.len() + frame.len() % 2;
    riff.extend_from_slice(&((4 + 8 + padded) as u32).to_le_bytes());
    riff.extend_from_slice(b"WEBPVP8 ");
    riff.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    riff.extend_from_slice(frame);
    if frame.len() % 2 == 1 {
        riff.push(0);
    }
    let img = image::load_from_memory_with_format(&riff, image::ImageFormat::WebP)
        .expect("VP8 frame")
        .to_rgb8();
    (img.width(), img.height(), img.into_raw())
}

fn check_webm(dir: &Path, name: &str, w: u32, h: u32, fps: u32, n: usize, text: Option<&str>) {
    let src = frames(n, w, h);
    let path = dir.join(name);
    write_video(&path, &src, fps, text, 0).unwrap();
    let b = std::fs::read(&path).unwrap();
    let top = children(&b, 0, b.len());
    assert_eq!(
        top.iter().map(|e| e.id).collect::<Vec<_>>(),
        [0x1A45_DFA3, 0x1853_8067]
    );
    let doc = child(&b, &top[0], 0x4282);
    assert_eq!(&b[doc.start..doc.end], b"webm");
    let seg = &top[1];
    let parts = children(&b, seg.start, seg.end);

    // The SeekHead points at the elements it names.
    let head = &parts[0];
    assert_eq!(head.id, 0x114D_9B74);
    for seek in children(&b, head.start, head.end)
        .iter()
        .filter(|e| e.id == 0x4DBB)
    {
        let id = child(&b, seek, 0x53AB);
        let pos = be_uint(&b, &child(&b, seek, 0x53AC)) as usize;
        let (at_id, _) = vint(&b, seg.start + pos, true);
        assert_eq!(at_id, be_uint(&b, &id), "seek entry");
    }

    let info = parts.iter().find(|e| e.id == 0x1549_A966).unwrap();
    assert_eq!(be_uint(&b, &child(&b, info, 0x2A_D7B1)), 1_000_000);
    let tracks = parts.iter().find(|e| e.id == 0x1654_AE6B).unwrap();
    let track = child(&b, tracks, 0xAE);
    let codec = child(&b, &track, 0x86);
    assert_eq!(&b[codec.start..codec.end], b"V_VP8");
    let frame_ns = (1e9 / f64::from(fps)).round() as u64;
    assert_eq!(be_uint(&b, &child(&b, &track, 0x23_E383)), frame_ns);
    let video = child(&b, &track, 0xE0);
    assert_eq!(be_uint(&b, &child(&b, &video, 0xB0)), u64::from(w));
    assert_eq!(be_uint(&b, &child(&b, &video, 0xBA)), u64::from(h));

    let comment = parts.iter().find(|e| e.id == 0x1254_C367).map(|tags| {
        let tag = child(&b, tags, 0x7373);
        let simple = child(&b, &tag, 0x67C8);
        let s = child(&b, &simple, 0x4487);
        String::from_utf8(b[s.start..s.end].to_vec()).unwrap()
    });
    assert_eq!(comment.as_deref(), text);

    // Every frame a key frame at its time, decoding to the source within VP8 loss; a cue
    // per cluster.
    let clusters: Vec<&Element> = parts.iter().filter(|e| e.id == 0x1F43_B675).collect();
    let mut index = 0;
    for cluster in &clusters {
        let t0 = be_uint(&b, &child(&b, cluster, 0xE7));
        for block in children(&b, cluster.start, cluster.end)
            .iter()
            .filter(|e| e.id == 0xA3)
        {
            let d = &b[block.start..block.end];
            assert_eq!((d[0], d[3]), (0x81, 0x80), "track 1, key frame");
            let rel = i16::from_be_bytes([d[1], d[2]]) as u64;
            let want_ms = (index as u64 * frame_ns + 500_000) / 1_000_000;
            assert_eq!(t0 + rel, want_ms, "frame {index} time");
            let (fw, fh, rgb) = decode_vp8(&d[4..]);
            assert_eq!((fw, fh), (w, h));
            let p = psnr(&rgb, &src[index].data);
            assert!(p >= JPEG_PSNR_FLOOR, "{name} frame {index}: PSNR {p:.1} dB");
            index += 1;
        }
    }
    assert_eq!(index, n);
    let cues = parts.iter().find(|e| e.id == 0x1C53_BB6B).unwrap();
    let points = children(&b, cues.start, cues.end);
    assert_eq!(points.len(), clusters.len());
    for (point, cluster) in points.iter().zip(&clusters) {
        let pos = child(&b, point, 0xB7);
        let at = be_uint(&b, &child(&b, &pos, 0xF1)) as usize;
        assert_eq!(vint(&b, seg.start + at, true).0, 0x1F43_B675);
        let t = be_uint(&b, &child(&b, point, 0xB3));
        assert_eq!(t, be_uint(&b, &child(&b, cluster, 0xE7)));
    }
    no_temp_files(dir);
}

#[test]
fn webm_is_vp8_key_frames_with_cues_and_comment() {
    let dir = tempfile::tempdir().unwrap();
    check_webm(dir.path(), "a.webm", 48, 32, 16, 5, Some(TEXT));
    // Odd sizes, no text; 12 frames at 2 fps span two clusters (5 s each).
    check_webm(dir.path(), "b.WEBM", 47, 31, 2, 12, None);
}

/// A stereo test tone: `n` samples at `rate`, left and right distinct.
fn tone(n: usize, rate: u32) -> Audio {
    let ch = |f: f32| {
        (0..n)
            .map(|i| 0.5 * (f * i as f32 / rate as f32 * std::f32::consts::TAU).sin())
            .collect::<Vec<f32>>()
    };
    Audio {
        sample_rate: rate,
        channels: vec![ch(440.0), ch(660.0)],
    }
}

/// 16-bit interleaved samples as upstream converts them.
fn pcm16(a: &Audio) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..a.len() {
        for c in &a.channels {
            let v = (c[i].clamp(-1.0, 1.0) * 32767.0).round_ties_even() as i16;
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[test]
fn webm_soundtrack_is_a_pcm_track_beside_the_frames() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("av.webm");
    // 7 frames at 24 fps = 0.2917 s; 9000 samples at 32 kHz = 0.28125 s (shorter, as MiniMax-H3's).
    let audio = tone(9000, 32_000);
    write_video_with_audio(&path, &frames(7, 32, 16), 24, None, 0, Some(&audio)).unwrap();
    let b = std::fs::read(&path).unwrap();
    let top = children(&b, 0, b.len());
    let seg = &top[1];
    let parts = children(&b, seg.start, seg.end);
    let tracks = parts.iter().find(|e| e.id == 0x1654_AE6B).unwrap();
    let entries = children(&b, tracks.start, tracks.end);
    assert_eq!(entries.len(), 2);
    let a = &entries[1];
    assert_eq!(be_uint(&b, &child(&b, a, 0xD7)), 2, "track number");
    assert_eq!(be_uint(&b, &child(&b, a, 0x83)), 2, "audio track");
    let codec = child(&b, a, 0x86);
    assert_eq!(&b[codec.start..codec.end], b"A_PCM/INT/LIT");
    let au = child(&b, a, 0xE1);
    assert_eq!(be_uint(&b, &child(&b, &au, 0x9F)), 2, "channels");
    assert_eq!(be_uint(&b, &child(&b, &au, 0x6264)), 16, "bit depth");
    let rate = child(&b, &au, 0xB5);
    let rate = match rate.end - rate.start {
        4 => f64::from(f32::from_be_bytes(
            b[rate.start..rate.end].try_into().unwrap(),
        )),
        _ => f64::from_be_bytes(b[rate.start..rate.end].try_into().unwrap()),
    };
    assert_eq!(rate, 32_000.0);
    // Track-2 blocks hold every sample in order, each after its frame's block.
    let mut pcm = Vec::new();
    let mut last_track = 0;
    let mut video_blocks = 0;
    for cluster in parts.iter().filter(|e| e.id == 0x1F43_B675) {
        for block in children(&b, cluster.start, cluster.end) {
            if block.id != 0xA3 {
                continue;
            }
            let track = b[block.start] & 0x7f;
            if track == 2 {
                assert_eq!(last_track, 1, "audio follows its frame");
                pcm.extend_from_slice(&b[block.start + 4..block.end]);
            } else {
                video_blocks += 1;
            }
            last_track = track;
        }
    }
    assert_eq!(video_blocks, 7);
    assert_eq!(pcm, pcm16(&audio));
}

#[test]
fn webp_and_sequences_get_the_soundtrack_beside() {
    let dir = tempfile::tempdir().unwrap();
    let audio = tone(3000, 32_000);
    let src = frames(3, 16, 16);
    let webp = dir.path().join("clip.webp");
    let written = write_video_with_audio(&webp, &src, 24, None, 0, Some(&audio)).unwrap();
    assert_eq!(written, vec![webp.clone(), dir.path().join("clip.wav")]);
    let back = read_wav(&dir.path().join("clip.wav")).unwrap();
    assert_eq!(back.sample_rate, 32_000);
    for (g, w) in back.channels.iter().zip(&audio.channels) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1.0 / 32767.0, "{a} vs {b}");
        }
    }
    let seq = dir.path().join("f_%03d.png");
    let written = write_video_with_audio(&seq, &src, 24, None, 0, Some(&audio)).unwrap();
    assert_eq!(written.len(), 4);
    assert_eq!(written[3], dir.path().join("f.wav"));
    assert_eq!(
        soundtrack_path(Path::new("out/%d.png")),
        Path::new("out/audio.wav")
    );
    assert_eq!(
        soundtrack_path(Path::new("a/clip-%02d-x.jpg")),
        Path::new("a/clip--x.wav")
    );
    // Without a soundtrack nothing is written beside.
    let written = write_video_with_audio(&webp, &src, 24, None, 0, None).unwrap();
    assert_eq!(written, vec![webp]);
}

/// Writes sample files for a manual check with an outside decoder (ffprobe, PyAV):
/// `SD_VIDEO_SAMPLES=/tmp/v cargo test --release --test video_io -- --ignored`.
#[test]
#[ignore]
fn write_samples_for_external_check() {
    let Some(dir) = std::env::var_os("SD_VIDEO_SAMPLES").map(PathBuf::from) else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    for (w, h) in [(48, 32), (47, 31)] {
        let src = frames(5, w, h);
        for ext in ["avi", "webm", "webp"] {
            let path = dir.join(format!("sample_{w}x{h}.{ext}"));
            write_video(&path, &src, 16, Some(TEXT), 0).unwrap();
            let path = dir.join(format!("sample_{w}x{h}_audio.{ext}"));
            let audio = tone(10_000, 32_000);
            write_video_with_audio(&path, &src, 16, Some(TEXT), 0, Some(&audio)).unwrap();
        }
        for (i, f) in src.iter().enumerate() {
            std::fs::write(dir.join(format!("src_{w}x{h}_{i}.rgb")), &f.data).unwrap();
        }
    }
}
