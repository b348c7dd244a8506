//! Clip decoding: bytes → mono float64 samples and a sample rate.
//!
//! WAV goes through `hound`, everything else through `symphonia`'s probe (MP3, FLAC, Ogg Vorbis).
//! Values follow `soundfile`'s float conversion (integer PCM divided by 2^(bits-1)), and channels
//! are averaged in float64, as the reference reads audio with `soundfile` and averages with numpy.
//! Nothing is allocated from a header's claims before they are checked against the byte count and
//! the duration limit, so a header claiming 4 GB costs nothing.

use super::AudioError;
use std::io::Cursor;

/// Mono samples and their rate.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedAudio {
    pub samples: Vec<f64>,
    pub sample_rate: u32,
}

/// Decodes WAV (RIFF/RIFX/RF64 magic → `hound`) or another container (`symphonia`), refusing clips
/// longer than `max_seconds`.
pub fn decode(bytes: &[u8], max_seconds: f64) -> Result<DecodedAudio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WAVE" {
        decode_wav(bytes, max_seconds)
    } else {
        // symphonia parses untrusted containers in pure Rust but does not promise to be
        // panic-free on every malformed stream; a panic there must not take the worker down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode_symphonia(bytes, max_seconds)
        }))
        .unwrap_or_else(|_| {
            Err(AudioError::Decode(
                "decoder failed on malformed input".into(),
            ))
        })
    }
}

fn check_rate(rate: u32) -> Result<(), AudioError> {
    if !(super::MIN_SAMPLE_RATE..=super::MAX_SAMPLE_RATE).contains(&rate) {
        return Err(AudioError::SampleRate(rate));
    }
    Ok(())
}

fn decode_wav(bytes: &[u8], max_seconds: f64) -> Result<DecodedAudio, AudioError> {
    let reader = hound::WavReader::new(Cursor::new(bytes)).map_err(|e| match e {
        hound::Error::Unsupported => {
            AudioError::UnsupportedWav("format not supported by hound".into())
        }
        hound::Error::FormatError(m) => AudioError::Wav(m.to_string()),
        other => AudioError::Wav(other.to_string()),
    })?;
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    if channels == 0 {
        return Err(AudioError::NoChannels);
    }
    check_rate(spec.sample_rate)?;
    let frames = reader.duration() as usize;
    let seconds = frames as f64 / f64::from(spec.sample_rate);
    if seconds > max_seconds {
        return Err(AudioError::TooLong {
            got_s: seconds,
            limit_s: max_seconds,
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
    if frames == 0 {
        return Err(AudioError::Empty);
    }
    let mut mono = Vec::with_capacity(frames);
    let inv_channels = 1.0 / channels as f64;
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
            return Err(AudioError::UnsupportedWav(format!(
                "{format:?} with {bits} bits per sample"
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

fn decode_symphonia(bytes: &[u8], max_seconds: f64) -> Result<DecodedAudio, AudioError> {
    use symphonia::core::audio::SampleBuffer;
    use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
    use symphonia::core::errors::Error;
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
        .map_err(|e| AudioError::Decode(format!("unrecognised audio container: {e}")))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| AudioError::Decode("no audio track".into()))?;
    let track_id = track.id;
    let rate = track
        .codec_params
        .sample_rate
        .ok_or_else(|| AudioError::Decode("unknown sample rate".into()))?;
    check_rate(rate)?;
    if let Some(n_frames) = track.codec_params.n_frames {
        let seconds = n_frames as f64 / f64::from(rate);
        if seconds > max_seconds {
            return Err(AudioError::TooLong {
                got_s: seconds,
                limit_s: max_seconds,
            });
        }
    }
    let max_frames = (max_seconds * f64::from(rate)).ceil() as usize;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| AudioError::Decode(format!("unsupported codec: {e}")))?;
    let mut mono = Vec::new();
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
        if mono.len() > max_frames {
            let seconds = mono.len() as f64 / f64::from(rate);
            return Err(AudioError::TooLong {
                got_s: seconds,
                limit_s: max_seconds,
            });
        }
    }
    if mono.is_empty() {
        return Err(AudioError::Empty);
    }
    Ok(DecodedAudio {
        samples: mono,
        sample_rate: rate,
    })
}
