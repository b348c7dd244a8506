//! Clip decoding: bytes → mono float64 samples and a sample rate.
//!
//! WAV goes through `hound`, everything else through `symphonia`'s probe (MP3, FLAC, Ogg Vorbis).
//! Values follow `soundfile`'s float conversion (integer PCM divided by 2^(bits-1)), and channels
//! are averaged in float64, as the reference reads audio with `soundfile` and averages with numpy.
//! Nothing is allocated from a header's claims before they are checked against the byte count,
//! the duration limit and the sample limits, so a header claiming 4 GB costs nothing; a stream
//! that states no length (or lies about it) is stopped while decoding, before the packet that
//! would pass a limit is stored.

use super::error::{AudioError, SampleLimit};
use super::options::AudioOptions;
use std::borrow::Cow;
use std::io::Cursor;

/// Mono samples and their rate.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedAudio {
    pub samples: Vec<f64>,
    pub sample_rate: u32,
}

/// Decodes WAV (RIFF/RIFX/RF64 magic → `hound`) or another container (`symphonia`), refusing clips
/// longer than `max_seconds` or over the default sample limits
/// ([`crate::limits::DEFAULT_MAX_AUDIO_SAMPLES`]); no resampling-cost limit applies.
pub fn decode(bytes: &[u8], max_seconds: f64) -> Result<DecodedAudio, AudioError> {
    decode_with(
        bytes,
        &AudioOptions {
            max_seconds,
            max_filter_taps: usize::MAX,
            ..AudioOptions::default()
        },
    )
}

/// Decodes under every limit of `options` that applies before features: the rate (its range and
/// its resampling filter length), the duration and the decoded sample frames (of the clip, and of
/// the request with `options.request_samples_used`). The encoded-size limit is the caller's
/// ([`super::features_from_bytes`] checks it).
pub fn decode_with(bytes: &[u8], options: &AudioOptions) -> Result<DecodedAudio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WAVE" {
        decode_wav(&as_hound_reads(bytes), options)
    } else {
        // symphonia parses untrusted containers in pure Rust but does not promise to be
        // panic-free on every malformed stream; a panic there must not take the worker down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode_symphonia(bytes, options)
        }))
        .unwrap_or_else(|_| {
            Err(AudioError::Decode(
                "decoder failed on malformed input".into(),
            ))
        })
    }
}

type WavReader<'a> = hound::WavReader<Cursor<&'a [u8]>>;

/// Opens a WAV clip and checks its header against every limit decoding checks before it
/// allocates: channels, rate, duration, the data chunk against the bytes, the sample limits.
fn open_wav<'a>(
    bytes: &'a [u8],
    options: &AudioOptions,
) -> Result<(WavReader<'a>, usize), AudioError> {
    let reader = hound::WavReader::new(Cursor::new(bytes)).map_err(|e| match e {
        hound::Error::Unsupported => AudioError::Unsupported(
            "a WAV encoding other than integer or float PCM (such as mu-law, A-law or ADPCM)"
                .into(),
        ),
        // A well-formed WAV of a sample width hound does not read (64-bit float, 12-bit).
        hound::Error::FormatError(
            m @ ("bits per sample is not 32"
            | "bits per sample is not a multiple of 8"
            | "bits per sample is not 8 or 16"),
        ) => AudioError::Unsupported(format!("a WAV of that sample width ({m})")),
        hound::Error::InvalidSampleFormat => {
            AudioError::Unsupported("a WAV of that sample width".into())
        }
        hound::Error::FormatError(m) => AudioError::Wav(m.to_string()),
        other => AudioError::Wav(other.to_string()),
    })?;
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    if channels == 0 {
        return Err(AudioError::NoChannels);
    }
    options.check_rate(spec.sample_rate)?;
    let frames = reader.duration() as usize;
    let seconds = frames as f64 / f64::from(spec.sample_rate);
    if seconds > options.max_seconds {
        return Err(AudioError::TooLong {
            got_s: seconds,
            limit_s: options.max_seconds,
        });
    }
    // The data chunk's claimed size must fit in what we were given: a header claiming gigabytes
    // is refused here, before any buffer is sized from it.
    let bytes_per_sample = usize::from(spec.bits_per_sample).div_ceil(8);
    let claimed = (reader.len() as usize).saturating_mul(bytes_per_sample);
    if claimed > bytes.len() {
        return Err(AudioError::Wav(format!(
            "data chunk claims {claimed} bytes but the file has only {} bytes",
            bytes.len()
        )));
    }
    // The header's length is exact here (data chunk ÷ block size, checked against the bytes), so
    // the sample limits are enforced from it before the one allocation sized by it.
    options.check_frames(frames as u64, spec.sample_rate)?;
    if frames == 0 {
        return Err(AudioError::Empty);
    }
    Ok((reader, frames))
}

/// The clip as `hound` reads it. Two WAVs that other readers take are rewritten, into the
/// `fmt ` and `data` chunks alone:
/// - a writer that cannot seek back (a pipe) leaves a marker as the `data` length ("to the end
///   of the file": 0xFFFFFFFF from ffmpeg, 0x7FFFF000 from SoX); the clip is whole in memory, so
///   the length is the bytes after the chunk's header, down to whole sample frames, as
///   `soundfile` reads such a file;
/// - a chunk of odd length before `data` is followed by a pad byte, which `hound` does not skip.
///
/// Every other clip is returned as it is.
fn as_hound_reads(bytes: &[u8]) -> Cow<'_, [u8]> {
    let (mut fmt, mut odd): (Option<std::ops::Range<usize>>, bool) = (None, false);
    let mut at = 12;
    while let Some(header) = bytes.get(at..at + 8) {
        let size = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let body = at + 8;
        if &header[..4] == b"data" {
            // ffmpeg leaves 0xFFFFFFFF, SoX 0x7FFFF000 (its "unspecified"); a stated length that
            // is wrong any other way stays the reader's to refuse.
            let to_the_end =
                (size == u32::MAX || size == 0x7FFF_F000) && body + size as usize > bytes.len();
            let Some(fmt) = fmt.filter(|_| odd || to_the_end) else {
                return Cow::Borrowed(bytes);
            };
            let data = if to_the_end {
                // WAVEFORMAT: tag, channels, rate, bytes per second, then the block alignment.
                let align = bytes[fmt.clone()].get(12..14);
                let Some(align) = align.map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
                else {
                    return Cow::Borrowed(bytes);
                };
                let left = bytes.len() - body;
                &bytes[body..body + left - left % align.max(1)]
            } else {
                // A length past the bytes is for the reader to refuse, as it is unrewritten.
                let Some(data) = bytes.get(body..body + size as usize) else {
                    return Cow::Borrowed(bytes);
                };
                data
            };
            return rewritten(&bytes[fmt], data).map_or(Cow::Borrowed(bytes), Cow::Owned);
        }
        if &header[..4] == b"fmt " {
            fmt = Some(body..body + size as usize).filter(|f| f.end <= bytes.len());
        }
        odd |= size & 1 == 1;
        // Chunks are padded to an even length.
        at = body + size as usize + (size as usize & 1);
    }
    Cow::Borrowed(bytes)
}

/// A WAV of one `fmt ` chunk of body `fmt` and one `data` chunk of body `data`; `None` when its
/// lengths do not fit the format's 32 bits.
fn rewritten(fmt: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    let fmt_len = u32::try_from(fmt.len()).ok()?;
    let data_len = u32::try_from(data.len()).ok()?;
    let pad = fmt.len() & 1;
    let riff = u32::try_from(4 + 8 + fmt.len() + pad + 8 + data.len()).ok()?;
    let mut out = Vec::with_capacity(riff as usize + 8);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&riff.to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&fmt_len.to_le_bytes());
    out.extend_from_slice(fmt);
    out.resize(out.len() + pad, 0);
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(data);
    Some(out)
}

fn decode_wav(bytes: &[u8], options: &AudioOptions) -> Result<DecodedAudio, AudioError> {
    let (reader, frames) = open_wav(bytes, options)?;
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    let inv_channels = 1.0 / channels as f64;
    if (spec.sample_format, spec.bits_per_sample) == (hound::SampleFormat::Int, 16) {
        let samples = reader.len() as usize;
        if let Some(data) = pcm16_data(reader.into_inner(), samples) {
            return Ok(DecodedAudio {
                samples: average_pcm16(data, channels, inv_channels),
                sample_rate: spec.sample_rate,
            });
        }
        // Not plain 2-byte samples (or cut short): hound reads it, or says what is wrong.
        let (reader, _) = open_wav(bytes, options)?;
        return decode_wav_samples(reader, frames, channels, inv_channels);
    }
    decode_wav_samples(reader, frames, channels, inv_channels)
}

/// The data chunk of a 16-bit PCM clip whose reader hound has just opened (so it stands at the
/// first sample, right after the chunk's 8-byte header), when the samples are stored in 2 bytes
/// each and all `samples` are present. hound does not expose its bytes-per-sample; its reader
/// refuses a chunk that is not a whole number of them, so `data_len = samples · bytes` and
/// 2 bytes is `data_len == 2 · samples`.
fn pcm16_data(cursor: Cursor<&[u8]>, samples: usize) -> Option<&[u8]> {
    let start = usize::try_from(cursor.position()).ok()?;
    let bytes = *cursor.get_ref();
    let header = bytes.get(start.checked_sub(8)?..start)?;
    let data_len = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
    if &header[..4] != b"data" || samples == 0 || data_len != samples.checked_mul(2)? {
        return None;
    }
    bytes.get(start..start.checked_add(data_len)?)
}

/// [`accumulate`]'s arithmetic on little-endian 16-bit samples read straight from the bytes
/// (hound's per-sample reader costs more than the rest of a clip's features), in blocks over the
/// caller's rayon pool: a 30 s clip is 3.8 MB of float64 to write, which one thread takes longer
/// over than the pool takes for the features of half the clip.
fn average_pcm16(data: &[u8], channels: usize, inv_channels: f64) -> Vec<f64> {
    let value = |b: &[u8]| f64::from(i16::from_le_bytes([b[0], b[1]])) * (1.0 / 32768.0);
    let frames = data.len() / (2 * channels);
    // Blocks of samples, each a plain loop over its bytes: it vectorises, where a per-sample
    // `map` through the pool's collector called the closure once per sample.
    crate::parallel::par_fill(frames, |first, out| {
        let bytes = &data[2 * channels * first..];
        if channels == 1 {
            let samples = out.iter_mut().zip(bytes.chunks_exact(2));
            samples.map(|(o, b)| o.write(value(b))).count()
        } else {
            let frames = out.iter_mut().zip(bytes.chunks_exact(2 * channels));
            frames
                .map(|(o, frame)| {
                    let sum = frame.chunks_exact(2).map(value).fold(0.0, |acc, v| acc + v);
                    o.write(sum * inv_channels)
                })
                .count()
        }
    })
}

fn decode_wav_samples(
    reader: WavReader<'_>,
    frames: usize,
    channels: usize,
    inv_channels: f64,
) -> Result<DecodedAudio, AudioError> {
    let spec = reader.spec();
    let mut mono = Vec::with_capacity(frames);
    match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Float, 32) => accumulate(
            reader.into_samples::<f32>().map(|s| s.map(f64::from)),
            channels,
            inv_channels,
            &mut mono,
        )?,
        (hound::SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => {
            let scale = 1.0 / f64::from(1u32 << (bits - 1));
            accumulate(
                reader
                    .into_samples::<i32>()
                    .map(|s| s.map(|v| f64::from(v) * scale)),
                channels,
                inv_channels,
                &mut mono,
            )?
        }
        (format, bits) => {
            return Err(AudioError::Unsupported(format!(
                "a WAV of {format:?} samples of {bits} bits"
            )))
        }
    }
    if mono.len() != frames {
        return Err(AudioError::Wav(format!(
            "expected {frames} frames, read {}",
            mono.len()
        )));
    }
    Ok(DecodedAudio {
        samples: mono,
        sample_rate: spec.sample_rate,
    })
}

/// Averages interleaved channels into `mono`. Summation order is channel 0, 1, …, then one
/// multiply, which matches numpy's `mean(axis=1)` for the channel counts audio has.
fn accumulate<I>(
    samples: I,
    channels: usize,
    inv_channels: f64,
    mono: &mut Vec<f64>,
) -> Result<(), AudioError>
where
    I: Iterator<Item = Result<f64, hound::Error>>,
{
    let mut acc = 0.0;
    let mut filled = 0;
    for sample in samples {
        let value = sample.map_err(|e| AudioError::Wav(format!("truncated sample data: {e}")))?;
        acc += value;
        filled += 1;
        if filled == channels {
            mono.push(if channels == 1 {
                acc
            } else {
                acc * inv_channels
            });
            acc = 0.0;
            filled = 0;
        }
    }
    Ok(())
}

/// What a clip's header states, read without decoding any sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClipHeader {
    pub sample_rate: u32,
    /// Sample frames, when the container states them (always for WAV; FLAC STREAMINFO, an MP3
    /// Xing/Info header, Ogg's last granule otherwise).
    pub frames: Option<u64>,
}

/// Reads a clip's header and checks it against the limits decoding checks first (the same
/// errors [`decode_with`] gives for them), without decoding: the encoded size, the rate, and the
/// stated length against the duration and sample limits. A clip that passes can still fail
/// while decoding.
pub fn probe(bytes: &[u8], options: &AudioOptions) -> Result<ClipHeader, AudioError> {
    if bytes.len() > options.max_bytes {
        return Err(AudioError::TooManyBytes {
            got: bytes.len(),
            limit: options.max_bytes,
        });
    }
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WAVE" {
        let bytes = as_hound_reads(bytes);
        let (reader, frames) = open_wav(&bytes, options)?;
        return Ok(ClipHeader {
            sample_rate: reader.spec().sample_rate,
            frames: Some(frames as u64),
        });
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (_, rate, frames) = open_symphonia(bytes, options)?;
        Ok(ClipHeader {
            sample_rate: rate,
            frames,
        })
    }))
    .unwrap_or_else(|_| {
        Err(AudioError::Decode(
            "decoder failed on malformed input".into(),
        ))
    })
}

type Opened = (
    Box<dyn symphonia::core::formats::FormatReader>,
    u32,
    Option<u64>,
);

/// Probes a non-WAV container and checks its first audio track's rate and stated length.
fn open_symphonia(bytes: &[u8], options: &AudioOptions) -> Result<Opened, AudioError> {
    use symphonia::core::codecs::CODEC_TYPE_NULL;
    super::metadata_guard::check(bytes)?;
    use symphonia::core::formats::FormatOptions;
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::MetadataOptions;
    use symphonia::core::probe::Hint;

    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &Hint::new(),
            source,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(|e| match e {
            symphonia::core::errors::Error::Unsupported(_) => AudioError::Unsupported(format!(
                "the bytes are in no audio container read here ({e})"
            )),
            // A container recognised, and its header broken or cut.
            e => AudioError::Decode(format!("malformed audio container: {e}")),
        })?;
    let format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| AudioError::Decode("no audio track".into()))?;
    let rate = track
        .codec_params
        .sample_rate
        .ok_or_else(|| AudioError::Decode("unknown sample rate".into()))?;
    options.check_rate(rate)?;
    // A stated length (FLAC STREAMINFO, an MP3 Xing/Info header, Ogg's last granule) is checked
    // before the decoder exists; a stream that states none, or states less than it holds, meets
    // the same bound while decoding, packet by packet.
    let n_frames = track.codec_params.n_frames;
    if let Some(n_frames) = n_frames {
        options.check_frames(n_frames, rate)?;
    }
    Ok((format, rate, n_frames))
}

fn decode_symphonia(bytes: &[u8], options: &AudioOptions) -> Result<DecodedAudio, AudioError> {
    use symphonia::core::audio::SampleBuffer;
    use symphonia::core::codecs::DecoderOptions;
    use symphonia::core::errors::Error;

    let (mut format, rate, stated) = open_symphonia(bytes, options)?;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != symphonia::core::codecs::CODEC_TYPE_NULL)
        .ok_or_else(|| AudioError::Decode("no audio track".into()))?;
    let track_id = track.id;
    let params = track.codec_params.clone();
    let max_frames = usize::try_from(options.max_frames(rate)).unwrap_or(usize::MAX);
    let mut decoder = symphonia::default::get_codecs()
        .make(&params, &DecoderOptions::default())
        .map_err(|e| AudioError::Unsupported(format!("the stream's codec ({e})")))?;
    // A stated length (already within the bound) is reserved at once: grown to by doubling,
    // the buffer was copied at each growth, and a 30-minute FLAC peaked at 1.14 GB for its
    // 687 MB of samples. Pages not written cost no memory, so a header that overstates costs
    // address space only; where even that is refused, the buffer grows as for no stated length.
    let mut mono = Vec::new();
    if let Some(n) = stated {
        let _ = mono.try_reserve_exact((n as usize).min(max_frames));
    }
    let mut buffer: Option<SampleBuffer<f32>> = None;
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(Error::ResetRequired) => break,
            Err(e) => return Err(AudioError::Decode(e.to_string())),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            // A corrupt frame in a lossy stream is skipped, as players do; anything else is fatal.
            Err(Error::DecodeError(_)) => continue,
            Err(e) => return Err(AudioError::Decode(e.to_string())),
        };
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        if channels == 0 {
            return Err(AudioError::NoChannels);
        }
        if spec.rate != rate {
            return Err(AudioError::Decode(format!(
                "sample rate changes mid-stream ({rate} → {} Hz)",
                spec.rate
            )));
        }
        // Refuse the packet that would pass a limit before any of it is stored, and grow the
        // buffer no further than the bound, so a stream of unstated length holds at most
        // `max_frames` samples whatever it declares.
        let total = mono.len().saturating_add(decoded.frames());
        if total > max_frames {
            options.check_frames(total as u64, rate)?;
            // check_frames refuses every total over max_frames, short of a NaN duration limit.
            return Err(AudioError::TooManySamples {
                got: total as u64,
                rate,
                limit: options.max_samples_per_clip,
                which: SampleLimit::PerClip,
            });
        }
        if total > mono.capacity() {
            // Doubling, and past half the bound straight to it: each growth copies the buffer,
            // so the last one (from at most half the bound) peaks at 1.5x the bound's bytes,
            // where doubling up to the bound could come to nearly 2x.
            let doubled = total.max(mono.capacity().saturating_mul(2));
            let target = if doubled > max_frames / 2 {
                max_frames
            } else {
                doubled
            };
            mono.reserve_exact(target - mono.len());
        }
        let needed = decoded.capacity() as u64;
        let buf = match &mut buffer {
            Some(b) if b.capacity() as u64 >= needed * channels as u64 => b,
            _ => buffer.insert(SampleBuffer::<f32>::new(needed, spec)),
        };
        buf.copy_interleaved_ref(decoded);
        let inv = 1.0 / channels as f64;
        for frame in buf.samples().chunks_exact(channels) {
            let sum: f64 = frame.iter().map(|&v| f64::from(v)).sum();
            mono.push(if channels == 1 { sum } else { sum * inv });
        }
    }
    if mono.is_empty() {
        return Err(AudioError::Empty);
    }
    // FLAC states its exact length; a stream that ends short of it was cut, or lost frames
    // that did not decode (the reference, soundfile, refuses such a file too).
    if params.codec == symphonia::core::codecs::CODEC_TYPE_FLAC {
        if let Some(stated) = stated.filter(|&n| (mono.len() as u64) < n) {
            return Err(AudioError::Decode(format!(
                "the FLAC stream ends after {} of the {stated} samples its header states \
                 (truncated or corrupt)",
                mono.len()
            )));
        }
    }
    Ok(DecodedAudio {
        samples: mono,
        sample_rate: rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct 16-bit read equals hound's per-sample reader (mono and 3 channels, with a
    /// chunk after the data that must not be read as samples).
    #[test]
    fn pcm16_fast_path_equals_hound() {
        for channels in [1u16, 3] {
            let spec = hound::WavSpec {
                channels,
                sample_rate: 16000,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            };
            let mut cursor = Cursor::new(Vec::new());
            let mut writer = hound::WavWriter::new(&mut cursor, spec).unwrap();
            for i in 0..3000i32 {
                writer
                    .write_sample(((i * 7919) % 65536 - 32768) as i16)
                    .unwrap();
            }
            writer.finalize().unwrap();
            let mut bytes = cursor.into_inner();
            bytes.extend_from_slice(b"LIST\x04\x00\x00\x00abcd");
            let options = AudioOptions::default();
            let fast = decode_with(&bytes, &options).unwrap();
            let (reader, _) = open_wav(&bytes, &options).unwrap();
            assert!(
                pcm16_data(reader.into_inner(), 3000).is_some(),
                "fast path taken"
            );
            let (reader, frames) = open_wav(&bytes, &options).unwrap();
            let inv = 1.0 / f64::from(channels);
            let slow = decode_wav_samples(reader, frames, usize::from(channels), inv).unwrap();
            assert_eq!(fast, slow, "{channels} channels");
            assert_eq!(fast.samples.len(), 3000 / usize::from(channels));
        }
    }
}
