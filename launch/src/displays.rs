//! The displays a run's or cell's runner sends back (`display()`, a
//! cell's value), held to the policy's `[output]` here, on the host side:
//! the runner is inside the jail, so what it sends is untrusted, whatever
//! it checked itself (`runner/src/display.py`).

use base64::Engine;

use pycell_wire::report::Display;
use pycell_wire::spec::MediaLimits;

/// Keep the displays the runner sent only as `limits` allow: at most
/// `count`, each text part cut to `part_chars` characters (head and tail
/// kept, as the runner cuts), a PNG part only if it is one within the
/// images' `max_edge`, all within `total_bytes` (a display too large
/// keeps its text alone, if that fits). The rest count as omitted; with no
/// limits the result takes no displays, so none is kept.
pub fn keep_valid_displays(
    displays: &mut Vec<Display>,
    omitted: &mut u32,
    limits: Option<MediaLimits>,
) {
    let sent = std::mem::take(displays);
    let count = sent.len();
    if let Some(limits) = limits {
        let mut left = limits.displays.total_bytes;
        for display in sent.into_iter().take(limits.displays.count as usize) {
            if let Some(kept) = fitted(display, limits, &mut left) {
                displays.push(kept);
            }
        }
    }
    *omitted = omitted.saturating_add((count - displays.len()) as u32);
}

/// `display` within `limits`, and what is left of the byte budget; None
/// if not even its text fits.
fn fitted(mut display: Display, limits: MediaLimits, left: &mut u64) -> Option<Display> {
    let chars = limits.displays.part_chars as usize;
    let parts = [
        Some(&mut display.text),
        display.markdown.as_mut(),
        display.html.as_mut(),
        display.json.as_mut(),
        display.svg.as_mut(),
    ];
    for part in parts.into_iter().flatten() {
        display.truncated |= pycell_protocol::bounds::cut_middle(part, chars);
    }
    if display
        .png
        .as_deref()
        .is_some_and(|p| !png_within(p, limits.images.max_edge))
    {
        display.png = None;
    }
    if size(&display) > *left {
        display = text_only(display);
    }
    let size = size(&display);
    (size <= *left).then(|| {
        *left -= size;
        display
    })
}

/// The bytes a display takes of the budget: all its parts.
fn size(d: &Display) -> u64 {
    let parts = [&d.markdown, &d.html, &d.json, &d.svg, &d.png];
    let rich: usize = parts
        .iter()
        .filter_map(|p| p.as_ref())
        .map(String::len)
        .sum();
    (d.text.len() + rich) as u64
}

fn text_only(d: Display) -> Display {
    Display {
        kind: d.kind,
        text: d.text,
        markdown: None,
        html: None,
        json: None,
        svg: None,
        png: None,
        truncated: d.truncated,
    }
}

/// Whether `base64` is a PNG whose header says it is at most `max_edge`
/// pixels a side (its size looked at before it is decoded).
fn png_within(base64: &str, max_edge: u32) -> bool {
    if pycell_protocol::bounds::base64_decoded_len(base64).is_none() {
        return false;
    }
    let Ok(png) = base64::engine::general_purpose::STANDARD.decode(base64) else {
        return false;
    };
    crate::launcher::png_size(&png)
        .is_some_and(|(w, h)| (1..=max_edge).contains(&w) && (1..=max_edge).contains(&h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::report::DisplayKind;
    use pycell_wire::spec::{DisplayLimits, ImageLimits};

    fn limits(part_chars: u32, total_bytes: u64, count: u32) -> MediaLimits {
        MediaLimits {
            images: ImageLimits {
                max_edge: 64,
                max_bytes: 1 << 20,
            },
            displays: DisplayLimits {
                part_chars,
                total_bytes,
                count,
            },
        }
    }

    fn text(t: &str) -> Display {
        Display {
            kind: DisplayKind::Display,
            text: t.to_string(),
            markdown: None,
            html: None,
            json: None,
            svg: None,
            png: None,
            truncated: false,
        }
    }

    fn png(width: u32, height: u32) -> String {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn displays_past_the_count_or_the_budget_are_counted_not_kept() {
        let mut sent = vec![text("one"), text("two"), text("three")];
        let mut omitted = 1;
        keep_valid_displays(&mut sent, &mut omitted, Some(limits(256, 1 << 10, 2)));
        assert_eq!(sent.len(), 2);
        assert_eq!(omitted, 2);

        let mut sent = vec![text(&"x".repeat(200)), text(&"y".repeat(200))];
        let mut omitted = 0;
        keep_valid_displays(&mut sent, &mut omitted, Some(limits(256, 300, 16)));
        assert_eq!((sent.len(), omitted), (1, 1));
        assert!(sent[0].text.starts_with('x'));
    }

    #[test]
    fn a_display_too_large_keeps_its_text_and_parts_are_cut() {
        let mut rich = text("df");
        rich.markdown = Some("m".repeat(1000));
        rich.html = Some("h".repeat(100));
        let mut sent = vec![rich.clone()];
        let mut omitted = 0;
        keep_valid_displays(&mut sent, &mut omitted, Some(limits(400, 1 << 10, 16)));
        let kept = &sent[0];
        assert!(kept.truncated);
        assert!(kept.markdown.as_ref().unwrap().chars().count() <= 400);
        assert_eq!(kept.html.as_deref(), Some("h".repeat(100).as_str()));

        let mut sent = vec![rich];
        keep_valid_displays(&mut sent, &mut omitted, Some(limits(400, 100, 16)));
        assert_eq!(sent[0].text, "df");
        assert!(sent[0].markdown.is_none() && sent[0].html.is_none());
        assert_eq!(omitted, 0);
    }

    #[test]
    fn only_a_png_within_the_edge_is_kept() {
        let mut small = text("img");
        small.png = Some(png(32, 16));
        let mut large = text("img");
        large.png = Some(png(65, 16));
        let mut fake = text("img");
        fake.png = Some(base64::engine::general_purpose::STANDARD.encode(b"GIF89a...."));
        let mut sent = vec![small, large, fake];
        let mut omitted = 0;
        keep_valid_displays(&mut sent, &mut omitted, Some(limits(256, 1 << 10, 16)));
        let kept: Vec<bool> = sent.iter().map(|d| d.png.is_some()).collect();
        assert_eq!(kept, [true, false, false]);
        assert_eq!(omitted, 0);
    }

    #[test]
    fn without_limits_nothing_is_kept() {
        let mut sent = vec![text("a")];
        let mut omitted = 0;
        keep_valid_displays(&mut sent, &mut omitted, None);
        assert!(sent.is_empty());
        assert_eq!(omitted, 1);
    }
}
