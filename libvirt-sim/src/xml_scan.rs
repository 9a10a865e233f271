//! Raw passes over an XML document: well-formedness, the root element's name, and the
//! raw text of elements the typed (serde) models do not interpret (`<metadata>`, devices).

use quick_xml::Reader;
use quick_xml::events::Event;

use crate::error::{Error, ErrorCode, Result};

fn line_of(xml: &str, pos: u64) -> usize {
    let end = (pos as usize).min(xml.len());
    xml.as_bytes()[..end].iter().filter(|b| **b == b'\n').count() + 1
}

fn detail(xml: &str, pos: u64, what: impl std::fmt::Display) -> Error {
    Error::with_message(ErrorCode::XmlDetail, format!("at line {}: {what}", line_of(xml, pos)))
}

/// Checks that `xml` is one well-formed element named `root` (libvirt's XML_DETAIL for
/// broken documents, XML_ERROR for a wrong root).
pub(crate) fn check_document(xml: &str, root: &str) -> Result<()> {
    let mut reader = Reader::from_str(xml);
    let mut depth = 0usize;
    let mut root_seen: Option<String> = None;
    let mut open: Vec<String> = Vec::new();
    loop {
        let pos = reader.buffer_position();
        match reader.read_event() {
            Err(e) => return Err(detail(xml, reader.error_position().max(pos), e)),
            Ok(Event::Start(e)) => {
                let name = e.name().as_ref().to_string();
                if depth == 0 {
                    if root_seen.is_some() {
                        return Err(detail(xml, pos, "Extra content at the end of the document"));
                    }
                    root_seen = Some(name.clone());
                }
                open.push(name);
                depth += 1;
            }
            Ok(Event::Empty(e)) => {
                if depth == 0 {
                    if root_seen.is_some() {
                        return Err(detail(xml, pos, "Extra content at the end of the document"));
                    }
                    root_seen = Some(e.name().as_ref().to_string());
                }
            }
            Ok(Event::End(_)) => {
                open.pop();
                depth = depth.saturating_sub(1);
            }
            Ok(Event::Text(t)) if depth == 0 => {
                if !t.chars().all(|c| c.is_ascii_whitespace()) {
                    return Err(detail(xml, pos, "Start tag expected, '<' not found"));
                }
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
        }
    }
    if let Some(tag) = open.last() {
        return Err(detail(xml, reader.buffer_position(), format!("Premature end of data in tag {tag}")));
    }
    match root_seen {
        None => Err(detail(xml, 0, "Document is empty")),
        Some(found) if found != root => Err(Error::xml(format!("expected root element '{root}', not '{found}'"))),
        Some(_) => Ok(()),
    }
}

/// One child element, as written in the source document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawElement {
    pub name: String,
    pub raw: String,
}

/// The child elements (raw) of the element reached by `path` from the root, e.g.
/// `["domain", "devices"]`. The document must already have passed [`check_document`].
pub(crate) fn children_raw(xml: &str, path: &[&str]) -> Vec<RawElement> {
    let mut reader = Reader::from_str(xml);
    let mut stack: Vec<String> = Vec::new();
    let mut out = Vec::new();
    loop {
        let pos = reader.buffer_position() as usize;
        let event = match reader.read_event() {
            Ok(Event::Eof) | Err(_) => break,
            Ok(event) => event,
        };
        let at_parent = stack.len() == path.len() && stack.iter().zip(path).all(|(a, b)| a == b);
        match event {
            Event::Start(e) => {
                let name = e.name().as_ref().to_string();
                if at_parent {
                    let end_name = e.name().as_ref().to_string();
                    if reader.read_to_end(quick_xml::name::QName(&end_name)).is_err() {
                        break;
                    }
                    let end = reader.buffer_position() as usize;
                    out.push(RawElement { name, raw: xml[pos..end].to_string() });
                } else {
                    stack.push(name);
                }
            }
            Event::Empty(e) if at_parent => {
                let end = reader.buffer_position() as usize;
                out.push(RawElement { name: e.name().as_ref().to_string(), raw: xml[pos..end].to_string() });
            }
            Event::End(_) => {
                if stack.len() == path.len() && at_parent {
                    break;
                }
                stack.pop();
            }
            _ => {}
        }
    }
    out
}

/// Escapes text for an attribute value or element content.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Maps a serde (quick-xml) error on an otherwise well-formed document to libvirt's class.
pub(crate) fn serde_error(kind: &str, err: quick_xml::DeError) -> Error {
    Error::xml(format!("could not read the {kind} definition: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_documents_are_xml_detail_errors() {
        for bad in ["<domain><name>x</name", "<domain>", "", "text", "<domain></network>"] {
            let err = check_document(bad, "domain").expect_err(bad);
            assert_eq!(err.code(), ErrorCode::XmlDetail, "{bad}: {err}");
        }
    }

    #[test]
    fn wrong_root_is_an_xml_error() {
        let err = check_document("<network/>", "domain").unwrap_err();
        assert_eq!(err.code(), ErrorCode::XmlError);
        assert!(err.message().contains("expected root element 'domain'"), "{err}");
    }

    #[test]
    fn children_are_returned_raw_in_order() {
        let xml = "<domain><devices><disk a='1'><x/></disk>\n<interface type='network'/><disk/></devices><metadata><m:a xmlns:m='u'>v</m:a></metadata></domain>";
        let devices = children_raw(xml, &["domain", "devices"]);
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["disk", "interface", "disk"]);
        assert_eq!(devices[0].raw, "<disk a='1'><x/></disk>");
        let meta = children_raw(xml, &["domain", "metadata"]);
        assert_eq!(meta[0].raw, "<m:a xmlns:m='u'>v</m:a>");
    }
}
