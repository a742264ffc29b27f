//! What only a session cell's result has, under `cell` of `run_python`'s
//! result (the last expression's value, the exception), and its part of
//! the text; and what runs and cells both have: the files they changed,
//! the images they made, what they showed with `display()`.

use schemars::JsonSchema;
use serde::Serialize;

use pycell_runner::session::{ChangedFile, Display, Image};
use pycell_wire::report::DisplayKind;

/// What a session cell has beyond a run's result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellInfo {
    /// The session the cell ran in.
    pub session: String,
    /// The cell's number in its session (1, 2, ...); 0 if it never ran.
    pub number: u64,
    /// The repr of the cell's last expression, as a Python REPL shows it
    /// (absent when the cell ends with a statement, or the value is None).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// True if the value's repr was longer than the cap and was cut.
    pub value_truncated: bool,
    /// A cut value kept whole in the session's workspace (JSON for a dict
    /// or list, else its text): read it with read_file, or from the next
    /// cell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_file: Option<String>,
    /// The exception the cell ended with, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception: Option<CellException>,
    /// The session's memory when the cell ended, in bytes.
    pub memory_bytes: u64,
    /// The session had been paused (idle) and this call resumed it: its
    /// names and files are back, and what a snapshot does not keep (open
    /// files, sockets, threads, child processes) is gone.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
}

/// The exception a cell ended with.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellException {
    /// Its class, e.g. `ZeroDivisionError`, `KeyboardInterrupt`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// As python prints it, frames of the cell only.
    pub traceback: String,
}

/// A file a cell created or changed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileChange {
    pub path: String,
    pub size: u64,
    /// Its sha256 in hex (absent when the run's files were too large together to read).
    pub sha256: Option<String>,
    /// True if the file is new.
    pub created: bool,
}

/// Something the code showed with `display()` (or a cell's value in a
/// richer form than its text), as MIME parts; a PNG part is sent as image
/// content, after the figures.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DisplayInfo {
    /// `display` (a display() call) or `value` (the cell's last value).
    pub kind: DisplayKind,
    /// text/plain.
    pub text: String,
    /// text/markdown: what the text content shows when present (pandas
    /// objects: shape, dtypes, a table of their first and last rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// text/html.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// application/json, as JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    /// image/svg+xml.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// Bytes of the image/png part sent as image content (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png_bytes: Option<u64>,
    /// True if a text part was cut to the policy's `[output] part_chars`
    /// (its head and tail kept).
    pub truncated: bool,
}

pub fn display_info(d: &Display) -> DisplayInfo {
    DisplayInfo {
        kind: d.kind,
        text: d.text.clone(),
        markdown: d.markdown.clone(),
        html: d.html.clone(),
        json: d.json.clone(),
        svg: d.svg.clone(),
        png_bytes: d
            .png
            .as_deref()
            .map(|p| pycell_protocol::bounds::base64_decoded_len(p).unwrap_or(0)),
        truncated: d.truncated,
    }
}

/// An image in the result's content.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ImageInfo {
    /// Where the full-size image is in /workspace (read it with read_file).
    pub path: String,
    /// Size of the image as sent, in pixels.
    pub width: u32,
    pub height: u32,
    /// Size of the PNG sent, in bytes.
    pub png_bytes: u64,
}

impl From<&ChangedFile> for FileChange {
    fn from(f: &ChangedFile) -> FileChange {
        FileChange {
            path: f.path.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
            created: f.created,
        }
    }
}

pub fn image_info(i: &Image) -> ImageInfo {
    ImageInfo {
        path: i.path.clone(),
        width: i.width,
        height: i.height,
        png_bytes: pycell_protocol::bounds::base64_decoded_len(&i.png).unwrap_or(0),
    }
}

/// The cell part of a result for a cell that never ran (its session
/// was over).
pub fn no_cell(session: &str) -> CellInfo {
    CellInfo {
        session: session.to_string(),
        number: 0,
        value: None,
        value_truncated: false,
        value_file: None,
        exception: None,
        memory_bytes: 0,
        resumed: false,
    }
}

/// A cell's part of the text content: the value (its markdown, if its
/// display has one), the exception.
pub fn render_cell(c: &CellInfo, displays: &[DisplayInfo], text: &mut String) {
    if c.resumed {
        text.push_str("\n(the session was paused while idle and resumed for this call: open files, sockets and threads of before are gone)\n");
    }
    if let Some(e) = &c.exception {
        text.push_str(&format!("\n--- exception ---\n{}", e.traceback));
        if !e.traceback.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(v) = &c.value {
        let cut = if c.value_truncated {
            " [truncated]"
        } else {
            ""
        };
        let markdown = displays
            .iter()
            .find(|d| d.kind == DisplayKind::Value)
            .and_then(|d| d.markdown.as_ref());
        match markdown {
            Some(m) => text.push_str(&format!("\nOut[{}]:{cut}\n{m}\n", c.number)),
            None => text.push_str(&format!("\nOut[{}]: {v}{cut}\n", c.number)),
        }
        if let Some(f) = &c.value_file {
            text.push_str(&format!("(the whole value: {f})\n"));
        }
    }
}

/// The displays' part of the text content: each `display()` call's
/// markdown, or its text (a value's is the cell's `Out`).
pub fn render_displays(displays: &[DisplayInfo], omitted: u32, text: &mut String) {
    for d in displays.iter().filter(|d| d.kind == DisplayKind::Display) {
        let body = d.markdown.as_ref().unwrap_or(&d.text);
        let cut = if d.truncated { " [truncated]" } else { "" };
        text.push_str(&format!("--- display{cut} ---\n{body}\n"));
    }
    if omitted > 0 {
        text.push_str(&format!(
            "{omitted} more displays were not sent (over the policy's [output] bounds)\n"
        ));
    }
}

/// The images' part of the text content.
pub fn render_images(images: &[ImageInfo], omitted: u32, text: &mut String) {
    for i in images {
        text.push_str(&format!(
            "image: {} (sent at {}x{})\n",
            i.path, i.width, i.height
        ));
    }
    if omitted > 0 {
        text.push_str(&format!(
            "{omitted} more images were not sent (over the result's image budget); their files are listed\n"
        ));
    }
}

/// The images, then the displays' PNG parts, as MCP image content, in
/// order (each a PNG the launcher checked); then the displays' HTML, SVG
/// and JSON parts as embedded resources (`pycell://displays/N.html`, N
/// counting from 1 in the result's `displays`), each within the policy's
/// `[output]` as the launcher held it.
pub fn media_content(images: &[Image], displays: &[Display]) -> Vec<rmcp::model::ContentBlock> {
    let figures = images.iter().map(|i| &i.png);
    let shown = displays.iter().filter_map(|d| d.png.as_ref());
    let pictures = figures
        .chain(shown)
        .map(|png| rmcp::model::ContentBlock::image(png.clone(), "image/png"));
    pictures.chain(display_resources(displays)).collect()
}

/// Each display's HTML, SVG and JSON part as an embedded text resource.
fn display_resources(displays: &[Display]) -> impl Iterator<Item = rmcp::model::ContentBlock> + '_ {
    displays.iter().enumerate().flat_map(|(i, d)| {
        let parts = [
            ("html", "text/html", &d.html),
            ("svg", "image/svg+xml", &d.svg),
            ("json", "application/json", &d.json),
        ];
        parts.into_iter().filter_map(move |(ext, mime, part)| {
            let text = part.as_ref()?;
            let contents = rmcp::model::ResourceContents::TextResourceContents {
                uri: format!("pycell://displays/{}.{ext}", i + 1),
                mime_type: Some(mime.to_string()),
                text: text.clone(),
                meta: None,
            };
            Some(rmcp::model::ContentBlock::resource(contents))
        })
    })
}
