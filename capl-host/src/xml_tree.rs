//! A small element tree over quick-xml, for reading the XML documents libvirt
//! returns (network, volume, domain, capabilities).
//!
//! Namespaces are resolved while parsing: every element carries the URI its
//! prefix (or the default namespace) is bound to, so `<metadata>` children are
//! matched by namespace URI, never by the prefix libvirt happened to print.

use std::collections::HashMap;

use quick_xml::XmlVersion;
use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

/// One parsed element.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XmlElement {
    /// The local name, without prefix.
    pub name: String,
    /// The namespace URI the element's prefix resolves to, if any.
    pub namespace: Option<String>,
    pub attributes: Vec<(String, String)>,
    pub children: Vec<XmlElement>,
    /// The concatenated text directly inside this element.
    pub text: String,
}

impl XmlElement {
    /// Parses a whole document and returns its root element.
    pub fn parse(xml: &str) -> Result<XmlElement, String> {
        let mut reader = Reader::from_str(xml);
        // Stack of open elements with the prefix bindings each one declared.
        let mut stack: Vec<(XmlElement, HashMap<String, String>)> = Vec::new();
        let mut root: Option<XmlElement> = None;
        loop {
            let event = reader.read_event().map_err(|e| format!("at byte {}: {e}", reader.error_position()))?;
            match event {
                Event::Start(start) => {
                    let opened = open_element(&start, &stack)?;
                    stack.push(opened);
                }
                Event::Empty(start) => {
                    let (element, _) = open_element(&start, &stack)?;
                    close_element(element, &mut stack, &mut root);
                }
                Event::End(_) => {
                    let (element, _) = stack.pop().ok_or("closing tag without an open element")?;
                    close_element(element, &mut stack, &mut root);
                }
                Event::Text(text) => {
                    if let Some((top, _)) = stack.last_mut() {
                        top.text.push_str(&text.xml_content(XmlVersion::Implicit1_0));
                    }
                }
                Event::CData(data) => {
                    if let Some((top, _)) = stack.last_mut() {
                        top.text.push_str(&data.xml_content(XmlVersion::Implicit1_0));
                    }
                }
                Event::GeneralRef(reference) => {
                    let resolved = match reference.resolve_char_ref().map_err(|e| e.to_string())? {
                        Some(ch) => ch.to_string(),
                        None => predefined_entity(&reference.xml_content(XmlVersion::Implicit1_0))?.to_string(),
                    };
                    if let Some((top, _)) = stack.last_mut() {
                        top.text.push_str(&resolved);
                    }
                }
                Event::Eof => break,
                _ => {}
            }
        }
        if !stack.is_empty() {
            return Err(format!("element <{}> is not closed", stack[stack.len() - 1].0.name));
        }
        root.ok_or_else(|| "the document has no root element".to_string())
    }

    /// The value of the attribute `name` (matched on the written name).
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The first child element with this local name.
    pub fn child(&self, name: &str) -> Option<&XmlElement> {
        self.children.iter().find(|c| c.name == name)
    }

    /// All child elements with this local name.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a XmlElement> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// Follows a path of local names from this element, taking the first match at each level.
    pub fn path(&self, names: &[&str]) -> Option<&XmlElement> {
        names.iter().try_fold(self, |element, name| element.child(name))
    }

    /// The trimmed text of the element at `names`, if present.
    pub fn path_text(&self, names: &[&str]) -> Option<&str> {
        self.path(names).map(|e| e.text.trim())
    }
}

fn predefined_entity(name: &str) -> Result<&'static str, String> {
    match name {
        "amp" => Ok("&"),
        "lt" => Ok("<"),
        "gt" => Ok(">"),
        "quot" => Ok("\""),
        "apos" => Ok("'"),
        other => Err(format!("unknown entity &{other};")),
    }
}

fn open_element(
    start: &BytesStart<'_>,
    stack: &[(XmlElement, HashMap<String, String>)],
) -> Result<(XmlElement, HashMap<String, String>), String> {
    let qualified = start.name().as_ref().to_string();
    let mut declared = HashMap::new();
    let mut attributes = Vec::new();
    for attribute in start.attributes() {
        let attribute = attribute.map_err(|e| format!("in <{qualified}>: {e}"))?;
        let key = attribute.key.as_ref().to_string();
        let value = attribute
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(|e| format!("in <{qualified}> attribute {key}: {e}"))?
            .into_owned();
        if key == "xmlns" {
            declared.insert(String::new(), value.clone());
        } else if let Some(prefix) = key.strip_prefix("xmlns:") {
            declared.insert(prefix.to_string(), value.clone());
        }
        attributes.push((key, value));
    }
    let (prefix, local) = match qualified.split_once(':') {
        Some((prefix, local)) => (prefix.to_string(), local.to_string()),
        None => (String::new(), qualified.clone()),
    };
    let namespace = declared
        .get(&prefix)
        .cloned()
        .or_else(|| stack.iter().rev().find_map(|(_, bindings)| bindings.get(&prefix).cloned()));
    let element = XmlElement { name: local, namespace, attributes, ..XmlElement::default() };
    Ok((element, declared))
}

fn close_element(
    element: XmlElement,
    stack: &mut [(XmlElement, HashMap<String, String>)],
    root: &mut Option<XmlElement>,
) {
    match stack.last_mut() {
        Some((parent, _)) => parent.children.push(element),
        None => *root = Some(element),
    }
}

/// Escapes text for use in element content or a quoted attribute value.
pub fn escape(text: &str) -> String {
    quick_xml::escape::escape(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_namespaces_entities_and_paths() {
        let xml = r#"<domain type='qemu'><name>a&amp;b</name>
            <metadata><x:m xmlns:x="urn:test"><x:uid>u&#49;</x:uid></x:m></metadata></domain>"#;
        let root = XmlElement::parse(xml).unwrap();
        assert_eq!(root.attr("type"), Some("qemu"));
        assert_eq!(root.path_text(&["name"]), Some("a&b"));
        let marker = root.path(&["metadata", "m"]).unwrap();
        assert_eq!(marker.namespace.as_deref(), Some("urn:test"));
        assert_eq!(marker.child("uid").unwrap().namespace.as_deref(), Some("urn:test"));
        assert_eq!(marker.path_text(&["uid"]), Some("u1"));
    }

    #[test]
    fn rejects_unclosed_documents() {
        assert!(XmlElement::parse("<a><b></b>").is_err());
        assert!(XmlElement::parse("").is_err());
    }
}
