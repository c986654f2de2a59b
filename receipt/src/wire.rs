//! The JSON form of a ledger [`Line`]: `{"v":..,"seq":..,"ts":..,"kind":..,
//! <the kind's fields>,"prev":..}`, written and read without an
//! intermediate tree.
//!
//! [`Entry`] derives serde as an externally tagged enum; the line puts its
//! variant name under `kind` and its fields beside `v`, `seq`, `ts` and
//! `prev`. Derived code for that shape (`#[serde(flatten)]` of an internally
//! tagged enum) buffers every line into serde's `Content` tree twice before
//! building the entry, which made parsing most of a reader's time. Here a
//! line whose `kind` comes before the kind's fields (every line the writer
//! ever wrote) is read in one pass: the fields go straight to the variant's
//! derived visitor, while `prev` (and any line field that comes late) is
//! taken out on the way. A line with kind fields before `kind` (a
//! hand-made file) is read through `serde_json::Value` instead: slower,
//! same result.

use std::borrow::Cow;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, VariantAccess,
    Visitor,
};
use serde::ser::{self, Impossible, SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::entry::{Entry, Line, RequestLine};

impl Serialize for Line {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("v", &self.v)?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("ts", &self.ts)?;
        self.entry.serialize(KindAndFields(&mut map))?;
        map.serialize_entry("prev", &self.prev)?;
        map.end()
    }
}

/// Serializes an [`Entry`] into an open map: `kind`, then its fields (those
/// of a struct variant, or of the struct a newtype variant holds).
struct KindAndFields<'m, M>(&'m mut M);

/// The fields of the variant, into the same map.
struct Fields<'m, M>(&'m mut M);

fn not_a_struct_variant<E: ser::Error>() -> E {
    E::custom("a ledger entry must be a struct variant or hold a struct")
}

impl<'m, M: SerializeMap> Serializer for KindAndFields<'m, M> {
    type Ok = ();
    type Error = M::Error;
    type SerializeSeq = Impossible<(), M::Error>;
    type SerializeTuple = Impossible<(), M::Error>;
    type SerializeTupleStruct = Impossible<(), M::Error>;
    type SerializeTupleVariant = Impossible<(), M::Error>;
    type SerializeMap = Impossible<(), M::Error>;
    type SerializeStruct = Fields<'m, M>;
    type SerializeStructVariant = Fields<'m, M>;

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Fields<'m, M>, M::Error> {
        self.0.serialize_entry("kind", variant)?;
        Ok(Fields(self.0))
    }

    fn serialize_bool(self, _: bool) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_i8(self, _: i8) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_i16(self, _: i16) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_i32(self, _: i32) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_i64(self, _: i64) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_u8(self, _: u8) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_u16(self, _: u16) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_u32(self, _: u32) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_u64(self, _: u64) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_f32(self, _: f32) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_f64(self, _: f64) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_char(self, _: char) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_str(self, _: &str) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_none(self) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_unit(self) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        self.0.serialize_entry("kind", variant)?;
        // The held struct's fields, through `serialize_struct` below.
        value.serialize(KindAndFields(self.0))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, M::Error> {
        Err(not_a_struct_variant())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, M::Error> {
        Err(not_a_struct_variant())
    }
    /// Only ever the struct a newtype variant holds (`kind` is written).
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, M::Error> {
        Ok(Fields(self.0))
    }
}

impl<M: SerializeMap> ser::SerializeStruct for Fields<'_, M> {
    type Ok = ();
    type Error = M::Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        self.0.serialize_entry(key, value)
    }

    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}

impl<M: SerializeMap> ser::SerializeStructVariant for Fields<'_, M> {
    type Ok = ();
    type Error = M::Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        self.0.serialize_entry(key, value)
    }

    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Line {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Line, D::Error> {
        d.deserialize_map(LineVisitor)
    }
}

/// A map key, borrowed from the input when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The line's own fields, wherever they come in the object.
#[derive(Default)]
struct Head {
    v: Option<u32>,
    seq: Option<u64>,
    ts: Option<String>,
    prev: Option<String>,
}

impl Head {
    /// Takes the value of `key` if it is a line field; `false` otherwise.
    fn take<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        fn set<T, E: de::Error>(
            slot: &mut Option<T>,
            value: T,
            name: &'static str,
        ) -> Result<(), E> {
            if slot.is_some() {
                return Err(E::duplicate_field(name));
            }
            *slot = Some(value);
            Ok(())
        }
        match key {
            "v" => set(&mut self.v, map.next_value()?, "v")?,
            "seq" => set(&mut self.seq, map.next_value()?, "seq")?,
            "ts" => set(&mut self.ts, map.next_value()?, "ts")?,
            "prev" => set(&mut self.prev, map.next_value()?, "prev")?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn finish<E: de::Error>(self, entry: Entry) -> Result<Line, E> {
        Ok(Line {
            v: self.v.ok_or_else(|| E::missing_field("v"))?,
            seq: self.seq.ok_or_else(|| E::missing_field("seq"))?,
            ts: self.ts.ok_or_else(|| E::missing_field("ts"))?,
            entry,
            prev: self.prev.ok_or_else(|| E::missing_field("prev"))?,
        })
    }
}

struct LineVisitor;

impl<'de> Visitor<'de> for LineVisitor {
    type Value = Line;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a ledger line (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Line, A::Error> {
        let mut head = Head::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if head.take(&key, &mut map)? {
                continue;
            }
            if key == "kind" {
                let Key(tag) = map.next_value::<Key<'de>>()?;
                let entry = Entry::deserialize(Tagged {
                    tag,
                    rest: Rest {
                        map: &mut map,
                        head: &mut head,
                    },
                })?;
                return head.finish(entry);
            }
            // A kind field before `kind`: collect the rest as values.
            let mut fields = serde_json::Map::new();
            fields.insert(key.into_owned(), map.next_value()?);
            let mut tag: Option<String> = None;
            while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                if head.take(&key, &mut map)? {
                    continue;
                }
                if key == "kind" {
                    if tag.is_some() {
                        return Err(de::Error::duplicate_field("kind"));
                    }
                    tag = Some(map.next_value()?);
                } else {
                    fields.insert(key.into_owned(), map.next_value()?);
                }
            }
            let tag = tag.ok_or_else(|| de::Error::missing_field("kind"))?;
            let mut tagged = serde_json::Map::new();
            tagged.insert(tag, serde_json::Value::Object(fields));
            let entry =
                Entry::deserialize(serde_json::Value::Object(tagged)).map_err(de::Error::custom)?;
            return head.finish(entry);
        }
        Err(de::Error::missing_field("kind"))
    }
}

/// The entries after `kind`, with the line's own fields taken out.
struct Rest<'a, A> {
    map: &'a mut A,
    head: &'a mut Head,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Rest<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(Key(key)) = self.map.next_key::<Key<'de>>()? {
            if self.head.take(&key, self.map)? {
                continue;
            }
            if key == "kind" {
                return Err(de::Error::duplicate_field("kind"));
            }
            let key: de::value::CowStrDeserializer<'_, A::Error> = key.into_deserializer();
            return seed.deserialize(key).map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// The rest, as the struct a newtype variant holds.
impl<'de, A: MapAccess<'de>> Deserializer<'de> for Rest<'_, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// `kind` and the rest of the line, as the externally tagged enum [`Entry`]
/// expects them.
struct Tagged<'a, 'de, A> {
    tag: Cow<'de, str>,
    rest: Rest<'a, A>,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Tagged<'_, 'de, A> {
    type Error = A::Error;

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("a ledger entry is read as an enum"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

impl<'a, 'de, A: MapAccess<'de>> EnumAccess<'de> for Tagged<'a, 'de, A> {
    type Error = A::Error;
    type Variant = Rest<'a, A>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Rest<'a, A>), A::Error> {
        let tag: de::value::CowStrDeserializer<'_, A::Error> = self.tag.into_deserializer();
        Ok((seed.deserialize(tag)?, self.rest))
    }
}

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Rest<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        Err(de::Error::custom("a ledger entry has fields"))
    }

    /// The struct a newtype variant holds: its fields are the rest.
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("a ledger entry has named fields"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self)
    }
}

/// Reads a `request` line in the exact form the writer writes it (fields in
/// declared order, no whitespace, no escapes, no unknown fields) into
/// `line`, reusing its strings' buffers: a ledger is nearly all request
/// lines, and allocating and freeing a dozen strings for each was most of
/// a reader's time. `false` (and `line` left in any state) for anything
/// else; the caller then reads the line with serde, so this is only ever a
/// faster way to the same [`Line`]: every text it accepts, serde reads to
/// the value it leaves (`same_as_serde` in the tests checks it).
pub(crate) fn read_request_into(text: &str, line: &mut Line) -> bool {
    read_request(&mut Cursor { text, at: 0 }, line).is_some()
}

fn read_request(c: &mut Cursor<'_>, line: &mut Line) -> Option<()> {
    if !matches!(line.entry, Entry::Request(_)) {
        line.entry = Entry::Request(RequestLine {
            service: String::new(),
            host: String::new(),
            method: String::new(),
            path: String::new(),
            query: None,
            status: 0,
            http: String::new(),
            tier: crate::entry::ListenerTier::Explicit,
            bytes_in: 0,
            bytes_out: None,
            duration_ms: 0,
            duration_us: None,
            upstream: String::new(),
            headers: Vec::new(),
            websocket: false,
            client_gone: false,
        });
    }
    let Entry::Request(RequestLine {
        service,
        host,
        method,
        path,
        query,
        status,
        http,
        tier,
        bytes_in,
        bytes_out,
        duration_ms,
        duration_us,
        upstream,
        headers,
        websocket,
        client_gone,
    }) = &mut line.entry
    else {
        return None;
    };
    c.lit(b"{\"v\":")?;
    line.v = u32::try_from(c.uint()?).ok()?;
    c.lit(b",\"seq\":")?;
    line.seq = c.uint()?;
    c.lit(b",\"ts\":")?;
    c.str_into(&mut line.ts)?;
    c.lit(b",\"kind\":\"request\",\"service\":")?;
    c.str_into(service)?;
    c.lit(b",\"host\":")?;
    c.str_into(host)?;
    c.lit(b",\"method\":")?;
    c.str_into(method)?;
    c.lit(b",\"path\":")?;
    c.str_into(path)?;
    if c.lit(b",\"query\":").is_some() {
        c.str_into(query.get_or_insert_with(String::new))?;
    } else {
        *query = None;
    }
    c.lit(b",\"status\":")?;
    *status = u16::try_from(c.uint()?).ok()?;
    c.lit(b",\"http\":")?;
    c.str_into(http)?;
    c.lit(b",\"tier\":")?;
    *tier = match c.str()? {
        "explicit" => crate::entry::ListenerTier::Explicit,
        "transparent" => crate::entry::ListenerTier::Transparent,
        "gateway" => crate::entry::ListenerTier::Gateway,
        _ => return None,
    };
    c.lit(b",\"bytes_in\":")?;
    *bytes_in = c.uint()?;
    *bytes_out = match c.lit(b",\"bytes_out\":") {
        Some(()) => Some(c.uint()?),
        None => None,
    };
    c.lit(b",\"duration_ms\":")?;
    *duration_ms = c.uint()?;
    *duration_us = match c.lit(b",\"duration_us\":") {
        Some(()) => Some(c.uint()?),
        None => None,
    };
    c.lit(b",\"upstream\":")?;
    c.str_into(upstream)?;
    let mut n = 0;
    // `[]` is read too, though the writer leaves an empty list out.
    if c.lit(b",\"headers\":[").is_some() && c.lit(b"]").is_none() {
        loop {
            if n == headers.len() {
                headers.push((String::new(), String::new()));
            }
            let (name, value) = &mut headers[n];
            n += 1;
            c.lit(b"[")?;
            c.str_into(name)?;
            c.lit(b",")?;
            c.str_into(value)?;
            c.lit(b"]")?;
            if c.lit(b",").is_none() {
                break;
            }
        }
        c.lit(b"]")?;
    }
    headers.truncate(n);
    *websocket = c.lit(b",\"websocket\":").is_some() && c.bool()?;
    *client_gone = c.lit(b",\"client_gone\":").is_some() && c.bool()?;
    c.lit(b",\"prev\":")?;
    c.str_into(&mut line.prev)?;
    c.lit(b"}")?;
    (c.at == c.text.len()).then_some(())
}

/// A position in a line for [`read_request_into`]; every method is `None`
/// where the text is not in the writer's exact form.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a [u8] {
        self.text.as_bytes().get(self.at..).unwrap_or_default()
    }

    /// Steps over `lit` if the text goes on with it.
    fn lit(&mut self, lit: &[u8]) -> Option<()> {
        self.rest().starts_with(lit).then(|| self.at += lit.len())
    }

    /// An unsigned integer as serde_json reads one: digits, no leading zero,
    /// no sign, fraction or exponent (those, and an overflow, are `None`).
    fn uint(&mut self) -> Option<u64> {
        let digits = self
            .rest()
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let number = &self.rest()[..digits];
        if digits == 0 || (digits > 1 && number[0] == b'0') {
            return None;
        }
        let mut n: u64 = 0;
        for d in number {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        self.at += digits;
        Some(n)
    }

    /// `true` or `false`.
    fn bool(&mut self) -> Option<bool> {
        if self.lit(b"true").is_some() {
            Some(true)
        } else {
            self.lit(b"false").map(|()| false)
        }
    }

    /// A string without escapes or control characters (serde_json refuses
    /// those raw, and an escape is left to serde to decode).
    fn str(&mut self) -> Option<&'a str> {
        let rest = self.rest().strip_prefix(b"\"")?;
        let len = memchr::memchr(b'"', rest)?;
        // Without an early exit, so the check runs many bytes a step; an
        // escaped quote before the real end is a backslash here too.
        let plain = rest[..len]
            .iter()
            .fold(true, |plain, &b| plain & (b != b'\\') & (b >= 0x20));
        if !plain {
            return None;
        }
        // Between two ASCII quotes of a `str`: on character boundaries.
        let s = self.text.get(self.at + 1..self.at + 1 + len)?;
        self.at += len + 2;
        Some(s)
    }

    /// [`Cursor::str`] into `out`'s buffer.
    fn str_into(&mut self, out: &mut String) -> Option<()> {
        let s = self.str()?;
        out.clear();
        out.push_str(s);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use crate::entry::{BlockedLine, RequestLine, UpstreamErrorLine};
    use crate::entry::{Entry, Line};

    fn line() -> Line {
        Line {
            v: 3,
            seq: 7,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Blocked(BlockedLine {
                path: Some("/a\"b".into()),
                reason: "strict".into(),
                ..BlockedLine::test("x.test")
            }),
            prev: "ab".repeat(32),
        }
    }

    #[test]
    fn the_written_form_is_the_v3_line() {
        let text = serde_json::to_string(&line()).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"v":3,"seq":7,"ts":"2026-11-29T07:28:19.123Z","kind":"blocked","host":"x.test","port":443,"tier":"explicit","path":"/a\"b","reason":"strict","prev":"{}"}}"#,
                "ab".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line());
    }

    #[test]
    fn any_field_order_reads_the_same() {
        let prev = "ab".repeat(32);
        for text in [
            format!(
                r#"{{"prev":"{prev}","kind":"blocked","host":"x.test","port":443,"tier":"explicit","path":"/a\"b","reason":"strict","ts":"2026-11-29T07:28:19.123Z","seq":7,"v":3}}"#
            ),
            format!(
                r#"{{"host":"x.test","v":3,"port":443,"kind":"blocked","tier":"explicit","seq":7,"path":"/a\"b","reason":"strict","ts":"2026-11-29T07:28:19.123Z","prev":"{prev}","extra":[1]}}"#
            ),
            format!(
                r#"{{"v":3,"seq":7,"ts":"2026-11-29T07:28:19.123Z","kind":"blocked","unknown":{{"a":1}},"host":"x.test","port":443,"tier":"explicit","path":"/a\"b","reason":"strict","prev":"{prev}"}}"#
            ),
        ] {
            assert_eq!(
                serde_json::from_str::<Line>(&text).unwrap(),
                line(),
                "{text}"
            );
        }
    }

    /// Request lines as the writer writes them: with and without the
    /// optional fields.
    fn requests() -> Vec<Line> {
        use crate::entry::ListenerTier::{Explicit, Transparent};
        let request = |query: Option<&str>, bytes_out, headers: &[(&str, &str)], flag| {
            Entry::Request(RequestLine {
                query: query.map(str::to_string),
                tier: if flag { Transparent } else { Explicit },
                bytes_in: 512,
                bytes_out,
                duration_ms: 3,
                upstream: "http://127.0.0.1:9/s/x/stripe/v1/charges".into(),
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                websocket: flag,
                client_gone: flag,
                ..RequestLine::test("stripe", "POST", "/v1/charges/ch_1")
            })
        };
        let line = |seq, entry| Line {
            v: 4,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry,
            prev: "ab".repeat(32),
        };
        vec![
            line(
                2,
                request(
                    Some("expand[]=customer&limit=10"),
                    Some(2048),
                    &[("idempotency-key", "key-2"), ("content-type", "text/plain")],
                    false,
                ),
            ),
            line(3, request(None, None, &[], true)),
            line(u64::MAX, request(Some(""), Some(0), &[("a", "")], false)),
            line(
                4,
                Entry::Request(RequestLine {
                    tier: crate::entry::ListenerTier::Gateway,
                    ..RequestLine::test("stripe", "GET", "/v1/balance")
                }),
            ),
        ]
    }

    #[test]
    fn the_writers_request_lines_take_the_fast_path() {
        // Into a blank line and into one that held another request.
        for scratch in requests() {
            for want in requests() {
                let text = serde_json::to_string(&want).unwrap();
                let mut got = scratch.clone();
                assert!(super::read_request_into(&text, &mut got), "{text}");
                assert_eq!(got, want);
            }
        }
        let mut other = line();
        let text = serde_json::to_string(&requests()[0]).unwrap();
        assert!(super::read_request_into(&text, &mut other));
        assert_eq!(other, requests()[0]);
    }

    /// Every edit of a request line by a byte (deleted, replaced, or one
    /// inserted): where the fast path reads it, serde reads the same line.
    #[test]
    fn the_fast_path_reads_what_serde_reads() {
        const BYTES: &[u8] = b" \t\n\"\\0195-+.eE,:}{[]xnulltrue\x00\x7f";
        let mut fast = 0;
        for want in requests() {
            let text = serde_json::to_string(&want).unwrap();
            let b = text.as_bytes();
            let mut edits: Vec<Vec<u8>> = Vec::new();
            for i in 0..=b.len() {
                if i < b.len() {
                    edits.push([&b[..i], &b[i + 1..]].concat());
                }
                for &c in BYTES {
                    if i < b.len() {
                        edits.push([&b[..i], &[c], &b[i + 1..]].concat());
                    }
                    edits.push([&b[..i], &[c], &b[i..]].concat());
                }
            }
            for edit in edits {
                let Ok(edit) = String::from_utf8(edit) else {
                    continue;
                };
                let mut got = requests()[0].clone();
                if super::read_request_into(&edit, &mut got) {
                    fast += 1;
                    let serde = serde_json::from_str::<Line>(&edit);
                    assert_eq!(serde.ok().as_ref(), Some(&got), "{edit}");
                }
            }
        }
        // Edits of values (a digit, a letter of a string) still read fast.
        assert!(fast > 1000, "{fast}");
    }

    /// Hostile request lines are left to serde, which reads (or refuses)
    /// them as before.
    #[test]
    fn hostile_request_lines_go_through_serde() {
        let text = serde_json::to_string(&requests()[0]).unwrap();
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for edit in [
            text.replace(r#""method":"POST""#, r#""method":"PO\u0053T""#),
            text.replace(r#""path":""#, r#""path":"\u0000\ud83d\ude00x"#),
            text.replace(r#""path":""#, r#""path":"\ud83d""#),
            text.replace(r#""status":200"#, r#""status":200,"status":201"#),
            text.replace(
                r#""bytes_in":512"#,
                r#""bytes_in":123456789012345678901234567890"#,
            ),
            text.replace(r#""bytes_in":512"#, r#""bytes_in":18446744073709551616"#),
            text.replace(r#""status":200"#, r#""status":65536"#),
            text.replace(r#""v":4"#, r#""v":4294967296"#),
            text.replace(r#""kind":"request""#, r#""kind":"requestx""#),
            text.replace(r#""prev""#, &format!(r#""extra":{deep},"prev""#)),
            text.replace(r#""query":"expand[]=customer&limit=10""#, r#""query":null"#),
            text.replace(r#""method":"POST""#, r#""method": "POST""#),
            text.replace(r#""tier":"explicit""#, r#""tier":"Explicit""#),
            text.replace(r#""status":200"#, r#""status":200.0"#),
            text.replace(r#""status":200"#, r#""status":0200"#),
            format!("{text} "),
            format!("{text}x"),
        ] {
            let mut got = requests()[1].clone();
            assert!(!super::read_request_into(&edit, &mut got), "{edit}");
        }
    }

    #[test]
    fn bad_lines_are_errors() {
        let prev = "ab".repeat(32);
        for text in [
            r#"{"v":3,"seq":7,"ts":"t","prev":"p"}"#.to_string(),
            r#"{"v":3,"seq":7,"ts":"t","kind":"teleport","prev":"p"}"#.to_string(),
            format!(r#"{{"v":3,"seq":7,"ts":"t","kind":"blocked","kind":"blocked","host":"x","port":1,"tier":"explicit","reason":"r","prev":"{prev}"}}"#),
            format!(r#"{{"v":3,"seq":7,"seq":8,"ts":"t","kind":"blocked","host":"x","port":1,"tier":"explicit","reason":"r","prev":"{prev}"}}"#),
            format!(r#"{{"v":3,"ts":"t","kind":"blocked","host":"x","port":1,"tier":"explicit","reason":"r","prev":"{prev}"}}"#),
            r#"{"v":3,"seq":7,"ts":"t","kind":"blocked","host":"x","tier":"explicit","reason":"r","prev":"p"}"#.to_string(),
            "[1,2]".to_string(),
        ] {
            assert!(serde_json::from_str::<Line>(&text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_v9_request_reads_its_microseconds_and_v8_lines_still_read() {
        use crate::entry::{LEDGER_VERSION, READABLE_VERSIONS};
        assert_eq!(LEDGER_VERSION, 9);
        assert!(READABLE_VERSIONS.contains(&8) && READABLE_VERSIONS.contains(&9));
        let prev = "ab".repeat(32);
        let v8 = format!(
            r#"{{"v":8,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"request","service":"stripe","host":"api.stripe.com","method":"GET","path":"/v1/charges","status":200,"http":"HTTP/1.1","tier":"explicit","bytes_in":0,"duration_ms":3,"upstream":"u","prev":"{prev}"}}"#
        );
        let v9 = v8.replace(r#""v":8"#, r#""v":9"#).replace(
            r#""duration_ms":3,"#,
            r#""duration_ms":0,"duration_us":412,"#,
        );
        for (text, ms, us) in [(&v8, 3, None), (&v9, 0, Some(412))] {
            // The fast reader and serde agree, and the line writes back as read.
            let mut fast = serde_json::from_str::<Line>(&v8).unwrap();
            assert!(crate::wire::read_request_into(text, &mut fast), "{text}");
            let slow = serde_json::from_str::<Line>(text).unwrap();
            assert_eq!(fast, slow);
            let Entry::Request(r) = &slow.entry else {
                panic!("{text}")
            };
            assert_eq!((r.duration_ms, r.duration_us), (ms, us));
            assert_eq!(&serde_json::to_string(&slow).unwrap(), text);
        }
    }

    #[test]
    fn a_v4_body_capture_line_round_trips_and_v3_lines_still_read() {
        use crate::entry::{CapturedBody, LEDGER_VERSION, READABLE_VERSIONS};
        assert_eq!(LEDGER_VERSION, 9);
        assert!(READABLE_VERSIONS.contains(&3) && READABLE_VERSIONS.contains(&4));
        let prev = "ab".repeat(32);
        let sha = "cd".repeat(32);
        let text = format!(
            r#"{{"v":4,"seq":9,"ts":"2026-11-29T07:28:19.123Z","kind":"body_capture","of":7,"request":{{"bytes":120,"mime":"application/json","file":"r-7-request.txt","sha256":"{sha}","stored":98,"truncated_at":64}},"response":{{"bytes":0,"skipped":"empty"}},"prev":"{prev}"}}"#
        );
        let line = serde_json::from_str::<Line>(&text).unwrap();
        assert_eq!(
            line.entry,
            Entry::BodyCapture {
                of: 7,
                request: CapturedBody {
                    bytes: 120,
                    mime: Some("application/json".into()),
                    file: Some("r-7-request.txt".into()),
                    sha256: Some(sha.clone()),
                    stored: Some(98),
                    truncated_at: Some(64),
                    skipped: None,
                },
                response: CapturedBody {
                    bytes: 0,
                    mime: None,
                    file: None,
                    sha256: None,
                    stored: None,
                    truncated_at: None,
                    skipped: Some("empty".into()),
                },
            }
        );
        assert_eq!(line.entry.kind(), "body_capture");
        assert_eq!(serde_json::to_string(&line).unwrap(), text);
        // A version-3 line as a version-3 writer wrote it reads as before.
        let v3 = format!(
            r#"{{"v":3,"seq":8,"ts":"t","kind":"response_incomplete","of":7,"service":"stripe","bytes":3,"reason":"twin_cut","prev":"{prev}"}}"#
        );
        let old = serde_json::from_str::<Line>(&v3).unwrap();
        assert_eq!(old.v, 3);
        assert_eq!(old.entry.kind(), "response_incomplete");
    }

    /// Version 8 added the origin `ingress`; a version-7 callback line
    /// reads as before.
    #[test]
    fn a_v8_ingress_callback_round_trips_and_v7_callbacks_still_read() {
        use crate::entry::READABLE_VERSIONS;
        assert!(READABLE_VERSIONS.contains(&7) && READABLE_VERSIONS.contains(&8));
        let prev = "ab".repeat(32);
        for (v, origin) in [(7, "twin"), (8, "ingress")] {
            let text = format!(
                r#"{{"v":{v},"seq":3,"ts":"2026-12-02T05:00:00.123Z","kind":"callback","service":"stripe","event":"charge.succeeded","event_id":"evt_1","target":"127.0.0.1:4242","method":"POST","path":"/webhook","status":200,"duration_ms":3,"attempt":1,"origin":"{origin}","prev":"{prev}"}}"#
            );
            let line = serde_json::from_str::<Line>(&text).unwrap();
            assert_eq!(line.v, v);
            match &line.entry {
                Entry::Callback(c) => assert_eq!(c.origin, origin),
                other => panic!("not a callback: {other:?}"),
            }
            assert_eq!(serde_json::to_string(&line).unwrap(), text);
        }
    }

    #[test]
    fn a_v5_upstream_error_with_its_body_round_trips_and_v4_lines_still_read() {
        use crate::entry::{ListenerTier, LEDGER_VERSION, READABLE_VERSIONS};
        assert_eq!(LEDGER_VERSION, 9);
        assert!(READABLE_VERSIONS.contains(&4));
        let prev = "ab".repeat(32);
        let text = format!(
            r#"{{"v":5,"seq":9,"ts":"2026-11-29T07:28:19.123Z","kind":"upstream_error","service":"stripe","host":"api.stripe.com","method":"POST","path":"/v1/customers","upstream":"http://twin/s/sbx/stripe/v1/customers","status":400,"error":"veris_request_body_incomplete","tier":"explicit","duration_ms":3,"bytes_in":10,"declared_in":100,"prev":"{prev}"}}"#
        );
        let line = serde_json::from_str::<Line>(&text).unwrap();
        match &line.entry {
            Entry::UpstreamError(UpstreamErrorLine {
                error,
                bytes_in,
                declared_in,
                tier,
                ..
            }) => {
                assert_eq!(error, "veris_request_body_incomplete");
                assert!(crate::entry::may_have_reached_twin(error));
                assert_eq!((*bytes_in, *declared_in), (Some(10), Some(100)));
                assert_eq!(*tier, ListenerTier::Explicit);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(serde_json::to_string(&line).unwrap(), text);
        // A version-4 line as a version-4 writer wrote it reads as before.
        let v4 = format!(
            r#"{{"v":4,"seq":8,"ts":"t","kind":"upstream_error","service":"stripe","host":"api.stripe.com","method":"POST","path":"/v1/charges","upstream":"u","status":502,"error":"veris_upstream_unreachable","tier":"explicit","duration_ms":30,"prev":"{prev}"}}"#
        );
        let old = serde_json::from_str::<Line>(&v4).unwrap();
        assert_eq!(old.v, 4);
        match old.entry {
            Entry::UpstreamError(UpstreamErrorLine {
                bytes_in: None,
                declared_in: None,
                ref error,
                ..
            }) => assert!(!crate::entry::may_have_reached_twin(error)),
            other => panic!("{other:?}"),
        }
        assert_eq!(serde_json::to_string(&old).unwrap(), v4);
    }

    /// Version 9 added `callback_dropped` and the callback's `tls`; both
    /// round-trip byte for byte.
    #[test]
    fn v9_dropped_events_and_tls_callbacks_round_trip() {
        let prev = "ab".repeat(32);
        let dropped = format!(
            r#"{{"v":9,"seq":4,"ts":"2026-12-04T23:00:00.123Z","kind":"callback_dropped","service":"stripe","events":6,"reason":"queue_full","prev":"{prev}"}}"#
        );
        let line = serde_json::from_str::<Line>(&dropped).unwrap();
        assert_eq!(
            line.entry,
            Entry::CallbackDropped(crate::entry::CallbackDroppedLine {
                service: "stripe".into(),
                events: 6,
                reason: "queue_full".into(),
            })
        );
        assert_eq!(serde_json::to_string(&line).unwrap(), dropped);
        let tls = format!(
            r#"{{"v":9,"seq":5,"ts":"2026-12-04T23:00:00.123Z","kind":"callback","service":"stripe","event":"charge.succeeded","event_id":"evt_1","target":"127.0.0.1:4242","method":"POST","path":"/webhook","status":200,"duration_ms":3,"attempt":1,"origin":"twin","tls":true,"prev":"{prev}"}}"#
        );
        let line = serde_json::from_str::<Line>(&tls).unwrap();
        match &line.entry {
            Entry::Callback(c) => assert!(c.tls),
            other => panic!("{other:?}"),
        }
        assert_eq!(serde_json::to_string(&line).unwrap(), tls);
    }

    /// A version-6 callback line (no `fault`) reads as a faithful delivery,
    /// and writes back byte for byte.
    #[test]
    fn a_v6_callback_line_still_reads() {
        let prev = "ab".repeat(32);
        let v6 = format!(
            r#"{{"v":6,"seq":9,"ts":"2026-12-04T13:39:14.698Z","kind":"callback","service":"stripe","event":"charge.succeeded","event_id":"evt_1","target":"127.0.0.1:4242","method":"POST","path":"/webhook","status":200,"duration_ms":3,"attempt":1,"origin":"twin","prev":"{prev}"}}"#
        );
        let old = serde_json::from_str::<Line>(&v6).unwrap();
        assert_eq!(old.v, 6);
        match &old.entry {
            Entry::Callback(c) => assert_eq!((c.origin.as_str(), &c.fault), ("twin", &None)),
            other => panic!("{other:?}"),
        }
        assert_eq!(serde_json::to_string(&old).unwrap(), v6);
    }
}
