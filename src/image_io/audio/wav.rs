//! RIFF/WAVE reading (PCM 8/16/24/32, float 32/64, plain or extensible) and 16-bit PCM
//! writing.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Audio, AudioIoError};
use crate::image_io::write::write_bytes_atomic;

/// Largest WAV file read (RIFF sizes are 32-bit).
pub const MAX_WAV_BYTES: u64 = 1 << 32;

const PCM: u16 = 1;
const IEEE_FLOAT: u16 = 3;
const EXTENSIBLE: u16 = 0xFFFE;
/// Bits per sample [`write_wav`] writes.
const OUT_BITS: u16 = 16;

/// Sample encodings the reader accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    U8,
    I16,
    I24,
    I32,
    F32,
    F64,
}

impl Encoding {
    fn bytes(self) -> usize {
        match self {
            Encoding::U8 => 1,
            Encoding::I16 => 2,
            Encoding::I24 => 3,
            Encoding::I32 | Encoding::F32 => 4,
            Encoding::F64 => 8,
        }
    }

    /// One sample from its little-endian bytes (`b.len() == self.bytes()`), scaled to [-1, 1].
    fn decode(self, b: &[u8]) -> f32 {
        match self {
            Encoding::U8 => (f32::from(b[0]) - 128.0) / 128.0,
            Encoding::I16 => f32::from(i16::from_le_bytes([b[0], b[1]])) / 32_768.0,
            // Sign-extend through the top byte of an i32.
            Encoding::I24 => (i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8) as f32 / 8_388_608.0,
            Encoding::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32 / 2_147_483_648.0,
            Encoding::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Encoding::F64 => {
                f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
            }
        }
    }
}

struct Format {
    encoding: Encoding,
    channels: usize,
    sample_rate: u32,
    block_align: usize,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn parse_fmt(path: &Path, fmt: &[u8]) -> Result<Format, AudioIoError> {
    let invalid = |reason: String| AudioIoError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if fmt.len() < 16 {
        return Err(invalid(format!(
            "'fmt ' chunk of {} bytes (at least 16)",
            fmt.len()
        )));
    }
    let mut tag = le16(fmt, 0);
    let channels = usize::from(le16(fmt, 2));
    let sample_rate = le32(fmt, 4);
    let block_align = usize::from(le16(fmt, 12));
    let bits = le16(fmt, 14);
    if tag == EXTENSIBLE {
        // cbSize ≥ 22, then valid bits, channel mask, and the sub-format GUID whose first two
        // bytes are the plain format tag.
        if fmt.len() < 40 || le16(fmt, 16) < 22 {
            return Err(invalid(
                "WAVE_FORMAT_EXTENSIBLE without its extension".into(),
            ));
        }
        tag = le16(fmt, 24);
    }
    let encoding = match (tag, bits) {
        (PCM, 8) => Encoding::U8,
        (PCM, 16) => Encoding::I16,
        (PCM, 24) => Encoding::I24,
        (PCM, 32) => Encoding::I32,
        (IEEE_FLOAT, 32) => Encoding::F32,
        (IEEE_FLOAT, 64) => Encoding::F64,
        _ => {
            let kind = match tag {
                PCM => "PCM".to_string(),
                IEEE_FLOAT => "IEEE float".to_string(),
                t => format!("format tag {t:#06x}"),
            };
            return Err(AudioIoError::Unsupported {
                path: path.to_path_buf(),
                format: format!(
                    "{kind}, {bits} bits per sample; PCM 8/16/24/32-bit and float 32/64-bit \
                     are read"
                ),
            });
        }
    };
    if channels == 0 {
        return Err(invalid("zero channels".into()));
    }
    if sample_rate == 0 {
        return Err(invalid("sample rate 0".into()));
    }
    if block_align < channels * encoding.bytes() {
        return Err(invalid(format!(
            "block align {block_align} is less than {channels} channels of {} bytes",
            encoding.bytes()
        )));
    }
    Ok(Format {
        encoding,
        channels,
        sample_rate,
        block_align,
    })
}

/// Reads a WAV file (see the module docs for the formats); every channel is kept.
pub fn read_wav(path: &Path) -> Result<Audio, AudioIoError> {
    let read_err = |source| AudioIoError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(read_err)?;
    let len = file.metadata().map_err(read_err)?.len();
    if len > MAX_WAV_BYTES {
        return Err(AudioIoError::Invalid {
            path: path.to_path_buf(),
            reason: format!("{len} bytes, more than a WAV file can hold"),
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_WAV_BYTES)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    read_wav_from_bytes(&bytes, path)
}

/// [`read_wav`] on the file's bytes; `path` only names the file in errors.
pub fn read_wav_from_bytes(bytes: &[u8], path: &Path) -> Result<Audio, AudioIoError> {
    let invalid = |reason: String| AudioIoError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(invalid("no RIFF/WAVE header".into()));
    }
    let mut format = None;
    let mut data: Option<&[u8]> = None;
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let size = le32(bytes, at + 4) as usize;
        let body = at + 8;
        let end = body.saturating_add(size);
        if id == b"fmt " {
            if end > bytes.len() {
                return Err(invalid("truncated 'fmt ' chunk".into()));
            }
            format = Some(parse_fmt(path, &bytes[body..end])?);
        } else if id == b"data" && data.is_none() {
            // Streaming writers leave the size 0 or 0xFFFFFFFF: take the bytes that are there.
            let end = if size == 0 || end > bytes.len() {
                if end > bytes.len() && size != u32::MAX as usize {
                    log::warn!(
                        "{}: the data chunk claims {size} bytes, {} are present",
                        path.display(),
                        bytes.len() - body
                    );
                }
                bytes.len()
            } else {
                end
            };
            data = Some(&bytes[body..end]);
        }
        // Chunks are padded to even sizes.
        at = end.saturating_add(size & 1);
    }
    let format = format.ok_or_else(|| invalid("no 'fmt ' chunk".into()))?;
    let data = data.ok_or_else(|| invalid("no 'data' chunk".into()))?;
    let frames = data.len() / format.block_align;
    if frames == 0 {
        return Err(invalid("no samples".into()));
    }
    let width = format.encoding.bytes();
    let mut channels = vec![Vec::with_capacity(frames); format.channels];
    for frame in data.chunks_exact(format.block_align) {
        for (c, ch) in channels.iter_mut().enumerate() {
            let v = format.encoding.decode(&frame[c * width..(c + 1) * width]);
            if !v.is_finite() {
                return Err(invalid(format!(
                    "non-finite sample at frame {} of channel {c}",
                    ch.len()
                )));
            }
            ch.push(v);
        }
    }
    Ok(Audio {
        sample_rate: format.sample_rate,
        channels,
    })
}

/// The bytes of `audio` as a 16-bit PCM WAV file; `path` only names the file in errors.
pub fn wav_bytes(audio: &Audio, path: &Path) -> Result<Vec<u8>, AudioIoError> {
    let encode = |reason: String| AudioIoError::Encode {
        path: PathBuf::from(path),
        reason,
    };
    let n = audio.len();
    let c = audio.channels.len();
    if c == 0 || n == 0 {
        return Err(encode("no samples".into()));
    }
    if audio.channels.iter().any(|ch| ch.len() != n) {
        return Err(encode("channels of different lengths".into()));
    }
    if audio.sample_rate == 0 {
        return Err(encode("sample rate 0".into()));
    }
    let block = c * usize::from(OUT_BITS / 8);
    let data_len = n
        .checked_mul(block)
        .filter(|&d| d <= (u32::MAX - 36) as usize && c <= usize::from(u16::MAX))
        .ok_or_else(|| encode(format!("{c} channels of {n} samples do not fit a WAV file")))?;
    let byte_rate = u64::from(audio.sample_rate) * block as u64;
    let byte_rate = u32::try_from(byte_rate)
        .map_err(|_| encode(format!("byte rate {byte_rate} does not fit a WAV header")))?;
    let mut out = Vec::with_capacity(44 + data_len);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&PCM.to_le_bytes());
    out.extend_from_slice(&(c as u16).to_le_bytes());
    out.extend_from_slice(&audio.sample_rate.to_le_bytes());
    out.extend_from_slice(&byte_rate.to_le_bytes());
    out.extend_from_slice(&(block as u16).to_le_bytes());
    out.extend_from_slice(&OUT_BITS.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data_len as u32).to_le_bytes());
    for i in 0..n {
        for ch in &audio.channels {
            let v = ch[i];
            let v = if v.is_nan() { 0.0 } else { v.clamp(-1.0, 1.0) };
            out.extend_from_slice(&((v * 32_767.0).round_ties_even() as i16).to_le_bytes());
        }
    }
    Ok(out)
}

/// Writes `audio` to `path` as 16-bit PCM WAV, atomically (an existing file is replaced only
/// by a complete one).
pub fn write_wav(path: &Path, audio: &Audio) -> Result<(), AudioIoError> {
    let bytes = wav_bytes(audio, path)?;
    Ok(write_bytes_atomic(path, &bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("test.wav")
    }

    /// A WAV file with one fmt chunk (`fmt` body) and one data chunk, plus an odd-sized
    /// chunk before them to exercise padding.
    fn file(fmt: &[u8], data: &[u8]) -> Vec<u8> {
        let mut b = b"RIFF\0\0\0\0WAVE".to_vec();
        b.extend_from_slice(b"LIST");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&[1, 2, 3, 0]);
        b.extend_from_slice(b"fmt ");
        b.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
        b.extend_from_slice(fmt);
        b.extend_from_slice(b"data");
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(data);
        let riff = (b.len() - 8) as u32;
        b[4..8].copy_from_slice(&riff.to_le_bytes());
        b
    }

    fn fmt(tag: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
        let align = channels * bits / 8;
        let mut f = Vec::new();
        f.extend_from_slice(&tag.to_le_bytes());
        f.extend_from_slice(&channels.to_le_bytes());
        f.extend_from_slice(&rate.to_le_bytes());
        f.extend_from_slice(&(rate * u32::from(align)).to_le_bytes());
        f.extend_from_slice(&align.to_le_bytes());
        f.extend_from_slice(&bits.to_le_bytes());
        f
    }

    fn extensible(sub: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
        let mut f = fmt(EXTENSIBLE, channels, rate, bits);
        f.extend_from_slice(&22u16.to_le_bytes());
        f.extend_from_slice(&bits.to_le_bytes());
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&sub.to_le_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xAA, 0, 0x38, 0x9B, 0x71]);
        f
    }

    fn read(b: &[u8]) -> Audio {
        read_wav_from_bytes(b, p()).unwrap()
    }

    #[test]
    fn pcm8_unsigned() {
        let a = read(&file(&fmt(PCM, 1, 8000, 8), &[0, 128, 255]));
        assert_eq!(a.sample_rate, 8000);
        assert_eq!(a.channels, vec![vec![-1.0, 0.0, 127.0 / 128.0]]);
    }

    #[test]
    fn pcm16_stereo() {
        let d: Vec<u8> = [i16::MIN, 16384, -1, i16::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = read(&file(&fmt(PCM, 2, 44_100, 16), &d));
        assert_eq!(
            a.channels,
            vec![vec![-1.0, -1.0 / 32768.0], vec![0.5, 32767.0 / 32768.0]]
        );
    }

    #[test]
    fn pcm24_sign_extends() {
        let d = [0x00, 0x00, 0x80, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF];
        let a = read(&file(&fmt(PCM, 1, 48_000, 24), &d));
        assert_eq!(
            a.channels[0],
            vec![-1.0, 8_388_607.0 / 8_388_608.0, -1.0 / 8_388_608.0]
        );
    }

    #[test]
    fn pcm32() {
        let d: Vec<u8> = [i32::MIN, 1 << 30]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = read(&file(&fmt(PCM, 1, 16_000, 32), &d));
        assert_eq!(a.channels[0], vec![-1.0, 0.5]);
    }

    #[test]
    fn float32_and_float64() {
        let d: Vec<u8> = [0.25f32, -0.75]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            read(&file(&fmt(IEEE_FLOAT, 1, 32_000, 32), &d)).channels[0],
            vec![0.25, -0.75]
        );
        let d: Vec<u8> = [0.125f64, -1.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            read(&file(&fmt(IEEE_FLOAT, 1, 32_000, 64), &d)).channels[0],
            vec![0.125, -1.5]
        );
    }

    #[test]
    fn extensible_pcm_and_float() {
        let d: Vec<u8> = [1000i16, -1000]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = read(&file(&extensible(PCM, 2, 22_050, 16), &d));
        assert_eq!(
            a.channels,
            vec![vec![1000.0 / 32768.0], vec![-1000.0 / 32768.0]]
        );
        let d: Vec<u8> = [0.5f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(&file(&extensible(IEEE_FLOAT, 1, 8000, 32), &d)).channels[0],
            vec![0.5]
        );
    }

    #[test]
    fn round_trip_16_bit_stereo() {
        let audio = Audio {
            sample_rate: 32_000,
            channels: vec![
                vec![0.0, 0.5, -0.5, 1.0, -1.0, 2.0],
                vec![0.25, -0.25, 0.1, -0.1, f32::NAN, -3.0],
            ],
        };
        let bytes = wav_bytes(&audio, p()).unwrap();
        assert_eq!(bytes.len(), 44 + 6 * 4);
        let back = read(&bytes);
        assert_eq!(back.sample_rate, 32_000);
        for (c, (a, b)) in audio.channels.iter().zip(&back.channels).enumerate() {
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                let want = if x.is_nan() { 0.0 } else { x.clamp(-1.0, 1.0) };
                assert!(
                    (want - y).abs() <= 1.0 / 32767.0,
                    "channel {c} sample {i}: {x} → {y}"
                );
            }
        }
    }

    #[test]
    fn writes_atomically_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("sd_cli_wav_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.wav");
        let audio = Audio {
            sample_rate: 32_000,
            channels: vec![vec![0.1, 0.2, 0.3], vec![-0.1, -0.2, -0.3]],
        };
        write_wav(&path, &audio).unwrap();
        let back = read_wav(&path).unwrap();
        assert_eq!(
            (back.sample_rate, back.len(), back.channels.len()),
            (32_000, 3, 2)
        );
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
        let err = write_wav(&dir.join("missing/x.wav"), &audio).unwrap_err();
        assert!(err.to_string().contains("x.wav"), "{err}");
    }

    #[test]
    fn to_stereo_duplicates_mono_and_keeps_first_two() {
        let mono = Audio {
            sample_rate: 32_000,
            channels: vec![vec![0.1, 0.2]],
        };
        let s = mono.to_stereo(32_000);
        assert_eq!(s.channels, vec![vec![0.1, 0.2], vec![0.1, 0.2]]);
        let three = Audio {
            sample_rate: 16_000,
            channels: vec![vec![0.0, 1.0], vec![0.5, 0.5], vec![9.0, 9.0]],
        };
        let s = three.to_stereo(32_000);
        assert_eq!(s.sample_rate, 32_000);
        assert_eq!(s.channels, vec![vec![0.0, 0.5, 1.0, 1.0], vec![0.5; 4]]);
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let good = file(&fmt(PCM, 2, 8000, 16), &[0; 8]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"RIFX\0\0\0\0WAVE".to_vec(), "RIFF"),
            (good[..10].to_vec(), "RIFF"),
            (file(&fmt(2, 1, 8000, 4), &[0; 4]), "unsupported"),
            (file(&fmt(PCM, 1, 8000, 12), &[0; 4]), "unsupported"),
            (file(&fmt(IEEE_FLOAT, 1, 8000, 16), &[0; 4]), "unsupported"),
            (file(&fmt(PCM, 0, 8000, 16), &[0; 4]), "zero channels"),
            (file(&fmt(PCM, 1, 0, 16), &[0; 4]), "sample rate"),
            (file(&fmt(PCM, 1, 8000, 16)[..12], &[0; 4]), "at least 16"),
            (file(&fmt(PCM, 1, 8000, 16), &[]), "no samples"),
            (
                file(&extensible(PCM, 1, 8000, 16)[..20], &[0; 4]),
                "EXTENSIBLE",
            ),
            (
                file(&fmt(IEEE_FLOAT, 1, 8000, 32), &f32::INFINITY.to_le_bytes()),
                "non-finite",
            ),
        ];
        for (bytes, want) in cases {
            let err = read_wav_from_bytes(&bytes, p()).unwrap_err().to_string();
            assert!(
                err.contains("test.wav") && err.contains(want),
                "{err} (wanted '{want}')"
            );
        }
        let mut small_align = fmt(PCM, 2, 8000, 16);
        small_align[12] = 2;
        let err = read_wav_from_bytes(&file(&small_align, &[0; 8]), p()).unwrap_err();
        assert!(err.to_string().contains("block align"), "{err}");
        // No fmt / no data chunk.
        let mut no_fmt = b"RIFF\0\0\0\0WAVEdata\x02\0\0\0\0\0".to_vec();
        assert!(read_wav_from_bytes(&no_fmt, p())
            .unwrap_err()
            .to_string()
            .contains("'fmt '"));
        no_fmt = good[..good.len() - 16].to_vec();
        let err = read_wav_from_bytes(&no_fmt, p()).unwrap_err().to_string();
        assert!(err.contains("test.wav"), "{err}");
        // Every truncation of a valid file is an error or a shorter clip, never a panic.
        for n in 0..good.len() {
            let _ = read_wav_from_bytes(&good[..n], p());
        }
        let err = read_wav(Path::new("/nonexistent/dir/a.wav"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("a.wav"), "{err}");
    }

    #[test]
    fn streamed_data_size_takes_what_is_there() {
        let mut b = file(&fmt(PCM, 1, 8000, 16), &[0, 0x40, 0, 0xC0]);
        let n = b.len();
        b[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(read(&b).channels[0], vec![0.5, -0.5]);
    }

    #[test]
    fn writer_refuses_empty_and_ragged_audio() {
        let empty = Audio {
            sample_rate: 32_000,
            channels: vec![],
        };
        assert!(wav_bytes(&empty, p()).is_err());
        let ragged = Audio {
            sample_rate: 32_000,
            channels: vec![vec![0.0; 3], vec![0.0; 2]],
        };
        assert!(wav_bytes(&ragged, p())
            .unwrap_err()
            .to_string()
            .contains("test.wav"));
    }
}
