//! iSNSP messages: request builders, response parsing and the answers a
//! client owes the server's own requests (RFC 4171 §5.6, §5.7).
//!
//! A request's payload is the source attribute (who asks: an iSCSI name),
//! the message key attributes (which object), the delimiter, then the
//! operating attributes (§5.6.1).

use std::net::SocketAddr;

use crate::attr::{self, tag, Attribute};
use crate::pdu::{self, flags, FunctionId, Message};
use crate::{IsnsError, Status};

/// A request ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its function.
    pub function: FunctionId,
    /// Extra flags ([`flags::REPLACE`]); CLIENT, FIRST and LAST are
    /// added when encoding.
    pub flags: u16,
    /// Source, key, delimiter and operating attributes, in order.
    pub attributes: Vec<Attribute>,
}

impl Request {
    fn new(
        function: FunctionId,
        source: Attribute,
        key: Vec<Attribute>,
        operating: Vec<Attribute>,
    ) -> Request {
        let mut attributes = Vec::with_capacity(2 + key.len() + operating.len());
        attributes.push(source);
        attributes.extend(key);
        attributes.push(Attribute::delimiter());
        attributes.extend(operating);
        Request {
            function,
            flags: 0,
            attributes,
        }
    }

    /// The request's PDUs, with this transaction ID.
    ///
    /// # Panics
    ///
    /// Never for a request built here from fewer than 4 GiB of attributes
    /// (more than 65535 PDUs cannot be numbered); see [`Request::try_encode`].
    pub fn encode(&self, transaction_id: u16) -> Vec<u8> {
        self.try_encode(transaction_id)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The request's PDUs, or an error when it is too large for iSNSP.
    pub fn try_encode(&self, transaction_id: u16) -> Result<Vec<u8>, IsnsError> {
        pdu::encode_message(
            self.function as u16,
            self.flags | flags::CLIENT,
            transaction_id,
            &attr::encode_all(&self.attributes),
        )
    }
}

/// DevAttrReg (§5.6.5.1): register or update objects. `key` names the
/// entity to update (its Entity Identifier), or is empty for a new one;
/// with `replace` the server drops the entity's previous registration.
pub fn dev_attr_reg(
    source: Attribute,
    key: Vec<Attribute>,
    operating: Vec<Attribute>,
    replace: bool,
) -> Request {
    let mut r = Request::new(FunctionId::DevAttrReg, source, key, operating);
    if replace {
        r.flags |= flags::REPLACE;
    }
    r
}

/// DevAttrQry (§5.6.5.2): the objects matching `key`, answering with the
/// `wanted` attributes (tags with empty values).
pub fn dev_attr_qry(source: Attribute, key: Vec<Attribute>, wanted: &[u32]) -> Request {
    Request::new(
        FunctionId::DevAttrQry,
        source,
        key,
        wanted.iter().map(|t| Attribute::empty(*t)).collect(),
    )
}

/// DevDereg (§5.6.5.4): deregister the objects the operating attributes
/// name (an Entity Identifier: the entity and everything in it; an iSCSI
/// Name: that node; a Portal IP Address and Port: that portal).
pub fn dev_dereg(source: Attribute, operating: Vec<Attribute>) -> Request {
    Request::new(FunctionId::DevDereg, source, Vec::new(), operating)
}

/// DDReg (§5.6.5.9): create a discovery domain (`dd_id` None; the server
/// picks the ID and returns it) or add members to one.
pub fn dd_reg(source: Attribute, dd_id: Option<u32>, operating: Vec<Attribute>) -> Request {
    let key = dd_id
        .map(|id| vec![Attribute::u32(tag::DD_ID, id)])
        .unwrap_or_default();
    Request::new(FunctionId::DdReg, source, key, operating)
}

/// DDDereg (§5.6.5.10): remove these members from discovery domain
/// `dd_id`, or the whole domain when `members` is empty.
pub fn dd_dereg(source: Attribute, dd_id: u32, members: Vec<Attribute>) -> Request {
    Request::new(
        FunctionId::DdDereg,
        source,
        vec![Attribute::u32(tag::DD_ID, dd_id)],
        members,
    )
}

/// The source attribute: the iSCSI name of the node asking.
pub fn source(name: &str) -> Attribute {
    Attribute::string(tag::ISCSI_NAME, name)
}

/// A network entity's operating attributes: its identifier, protocol
/// iSCSI, and the registration period in seconds (0: the server's).
pub fn entity(eid: &str, registration_period: u32) -> Vec<Attribute> {
    let mut v = vec![
        Attribute::string(tag::ENTITY_IDENTIFIER, eid),
        Attribute::u32(tag::ENTITY_PROTOCOL, attr::ENTITY_PROTOCOL_ISCSI),
    ];
    if registration_period > 0 {
        v.push(Attribute::u32(
            tag::REGISTRATION_PERIOD,
            registration_period,
        ));
    }
    v
}

/// A portal's attributes: IP address and TCP port.
pub fn portal(addr: SocketAddr) -> Vec<Attribute> {
    vec![
        Attribute::ip(tag::PORTAL_IP_ADDRESS, addr.ip()),
        Attribute::tcp_port(tag::PORTAL_PORT, addr.port()),
    ]
}

/// An iSCSI target node's attributes: name, node type target, alias.
pub fn target_node(name: &str, alias: Option<&str>) -> Vec<Attribute> {
    let mut v = vec![
        Attribute::string(tag::ISCSI_NAME, name),
        Attribute::u32(tag::ISCSI_NODE_TYPE, attr::NODE_TYPE_TARGET),
    ];
    if let Some(a) = alias {
        v.push(Attribute::string(tag::ISCSI_ALIAS, a));
    }
    v
}

/// A portal group object: `node` is reachable through `portal` with this
/// portal group tag.
pub fn portal_group(node: &str, portal: SocketAddr, pgt: u16) -> Vec<Attribute> {
    vec![
        Attribute::string(tag::PG_ISCSI_NAME, node),
        Attribute::ip(tag::PG_PORTAL_IP_ADDRESS, portal.ip()),
        Attribute::tcp_port(tag::PG_PORTAL_PORT, portal.port()),
        Attribute::u32(tag::PG_TAG, u32::from(pgt)),
    ]
}

/// Discovery domain members by iSCSI name.
pub fn dd_members<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<Attribute> {
    names
        .into_iter()
        .map(|n| Attribute::string(tag::DD_MEMBER_ISCSI_NAME, n))
        .collect()
}

/// A parsed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Its function ID (the request's with [`pdu::RESPONSE`] set).
    pub function: u16,
    /// Transaction ID.
    pub transaction_id: u16,
    /// The status code.
    pub status: Status,
    /// The attributes after the status code.
    pub attributes: Vec<Attribute>,
}

impl Response {
    /// Parse a message as a response: a status code, then attributes.
    pub fn parse(msg: &Message) -> Result<Response, IsnsError> {
        let status = msg
            .payload
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(IsnsError::NoStatus(msg.payload.len()))?;
        Ok(Response {
            function: msg.function,
            transaction_id: msg.transaction_id,
            status: Status(status),
            attributes: attr::decode_all(&msg.payload[4..])?,
        })
    }

    /// Check that this answers `request` sent with `transaction_id` and
    /// succeeded; returns its attributes.
    pub fn check(
        self,
        request: FunctionId,
        transaction_id: u16,
    ) -> Result<Vec<Attribute>, IsnsError> {
        if self.function != request.response() {
            return Err(IsnsError::UnexpectedFunction {
                got: self.function,
                expected: request.response(),
            });
        }
        if self.transaction_id != transaction_id {
            return Err(IsnsError::TransactionMismatch {
                got: self.transaction_id,
                expected: transaction_id,
            });
        }
        if !self.status.is_success() {
            return Err(IsnsError::Rejected {
                function: request.name(),
                status: self.status,
            });
        }
        Ok(self.attributes)
    }
}

/// The first attribute with this tag.
pub fn find(attrs: &[Attribute], tag: u32) -> Option<&Attribute> {
    attrs.iter().find(|a| a.tag == tag)
}

/// The DD ID a DDReg response returns.
pub fn dd_id(attrs: &[Attribute]) -> Result<u32, IsnsError> {
    find(attrs, tag::DD_ID)
        .and_then(Attribute::as_u32)
        .filter(|id| *id != 0)
        .ok_or(IsnsError::MissingAttribute {
            function: "DDRegRsp",
            what: "DD ID",
        })
}

/// The registration period a DevAttrRegRsp grants, if it says.
pub fn registration_period(attrs: &[Attribute]) -> Option<u32> {
    find(attrs, tag::REGISTRATION_PERIOD).and_then(Attribute::as_u32)
}

/// What to do with a message the server sent on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMessage {
    /// A response to one of our requests.
    Response(Response),
    /// A request from the server (ESI, SCN) and the bytes to answer it.
    Request {
        /// The request.
        function: FunctionId,
        /// The encoded response to send.
        reply: Vec<u8>,
    },
    /// A request this client does not handle; the encoded answer says
    /// "message not supported" (status 15).
    Unsupported {
        /// Its function ID.
        function: u16,
        /// The encoded response to send.
        reply: Vec<u8>,
    },
}

/// Classify a message received from the server: a response, or a server
/// request (ESI is answered with ESIRsp echoing its attributes, SCN with
/// SCNRsp carrying its destination attribute, §5.7.5).
pub fn from_server(msg: &Message) -> Result<ServerMessage, IsnsError> {
    if msg.function & pdu::RESPONSE != 0 {
        return Response::parse(msg).map(ServerMessage::Response);
    }
    let reply = |status: u32, attrs: &[Attribute]| {
        let mut payload = status.to_be_bytes().to_vec();
        payload.extend_from_slice(&attr::encode_all(attrs));
        pdu::encode_message(
            msg.function | pdu::RESPONSE,
            flags::CLIENT,
            msg.transaction_id,
            &payload,
        )
    };
    match FunctionId::from_u16(msg.function) {
        Some(f @ FunctionId::Esi) => {
            let attrs = attr::decode_all(&msg.payload)?;
            Ok(ServerMessage::Request {
                function: f,
                reply: reply(0, &attrs)?,
            })
        }
        Some(f @ FunctionId::Scn) => {
            let attrs = attr::decode_all(&msg.payload)?;
            Ok(ServerMessage::Request {
                function: f,
                reply: reply(0, &attrs[..attrs.len().min(1)])?,
            })
        }
        _ => Ok(ServerMessage::Unsupported {
            function: msg.function,
            reply: reply(15, &[])?,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{Assembler, Pdu};

    fn one_message(bytes: &[u8]) -> Message {
        let (pdu, used) = Pdu::decode(bytes).unwrap();
        assert_eq!(used, bytes.len());
        Assembler::new().push(pdu).unwrap().unwrap()
    }

    #[test]
    fn dev_attr_reg_layout() {
        let p: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let mut op = entity("host.ethersan", 900);
        op.extend(portal(p));
        op.extend(target_node("iqn.2026-11.org.x:t", Some("disk")));
        op.extend(portal_group("iqn.2026-11.org.x:t", p, 1));
        let eid = Attribute::string(tag::ENTITY_IDENTIFIER, "host.ethersan");
        let r = dev_attr_reg(source("iqn.2026-11.org.x:t"), vec![eid], op, true);
        let bytes = r.encode(5);
        let m = one_message(&bytes);
        assert_eq!(m.function, 1);
        assert_eq!(
            m.flags,
            flags::CLIENT | flags::REPLACE | flags::FIRST_PDU | flags::LAST_PDU
        );
        let attrs = attr::decode_all(&m.payload).unwrap();
        assert_eq!(attrs, r.attributes);
        let tags: Vec<u32> = attrs.iter().map(|a| a.tag).collect();
        assert_eq!(
            tags,
            [32, 1, 0, 1, 2, 6, 16, 17, 32, 33, 34, 48, 49, 50, 51]
        );
        assert_eq!(attrs[9].as_u32(), Some(attr::NODE_TYPE_TARGET));
        assert_eq!(attrs[7].as_port(), Some(3260));
    }

    #[test]
    fn dd_requests() {
        let r = dd_reg(
            source("iqn.2026-11.org.x:t"),
            None,
            [
                vec![Attribute::string(tag::DD_SYMBOLIC_NAME, "dd")],
                dd_members(["iqn.2026-11.org.x:t", "iqn.2026-11.org.x:i"]),
            ]
            .concat(),
        );
        let tags: Vec<u32> = r.attributes.iter().map(|a| a.tag).collect();
        assert_eq!(tags, [32, 0, 2066, 2068, 2068]);
        let r = dd_dereg(source("iqn.2026-11.org.x:t"), 7, vec![]);
        assert_eq!(r.attributes[1].as_u32(), Some(7));
        assert_eq!(r.function as u16, 0x000A);
        let q = dev_attr_qry(source("x"), vec![], &[tag::ISCSI_NAME]);
        assert_eq!(q.attributes.last().unwrap().value.len(), 0);
    }

    fn response(function: u16, xid: u16, status: u32, attrs: &[Attribute]) -> Message {
        let mut payload = status.to_be_bytes().to_vec();
        payload.extend(attr::encode_all(attrs));
        one_message(&pdu::encode_message(function, flags::SERVER, xid, &payload).unwrap())
    }

    #[test]
    fn responses_parse_and_check() {
        let m = response(0x8009, 3, 0, &[Attribute::u32(tag::DD_ID, 4)]);
        let attrs = Response::parse(&m)
            .unwrap()
            .check(FunctionId::DdReg, 3)
            .unwrap();
        assert_eq!(dd_id(&attrs), Ok(4));
        let m = response(0x8001, 3, 3, &[]);
        let e = Response::parse(&m)
            .unwrap()
            .check(FunctionId::DevAttrReg, 3)
            .unwrap_err();
        assert_eq!(
            e,
            IsnsError::Rejected {
                function: "DevAttrReg",
                status: Status::INVALID_REGISTRATION
            }
        );
        assert!(e.to_string().contains("invalid registration"));
        let m = response(0x8001, 4, 0, &[]);
        assert!(matches!(
            Response::parse(&m)
                .unwrap()
                .check(FunctionId::DevAttrReg, 3),
            Err(IsnsError::TransactionMismatch { .. })
        ));
        assert!(matches!(
            Response::parse(&m).unwrap().check(FunctionId::DdReg, 4),
            Err(IsnsError::UnexpectedFunction { .. })
        ));
        let empty = Message {
            function: 0x8001,
            flags: 0,
            transaction_id: 1,
            payload: vec![],
        };
        assert_eq!(Response::parse(&empty), Err(IsnsError::NoStatus(0)));
        assert_eq!(
            dd_id(&[]),
            Err(IsnsError::MissingAttribute {
                function: "DDRegRsp",
                what: "DD ID"
            })
        );
    }

    #[test]
    fn esi_and_scn_are_answered() {
        let attrs = vec![
            Attribute::string(tag::ENTITY_IDENTIFIER, "e"),
            Attribute::ip(tag::PORTAL_IP_ADDRESS, "127.0.0.1".parse().unwrap()),
        ];
        let esi = one_message(
            &pdu::encode_message(0x000D, flags::SERVER, 11, &attr::encode_all(&attrs)).unwrap(),
        );
        let ServerMessage::Request { function, reply } = from_server(&esi).unwrap() else {
            panic!("ESI not recognised")
        };
        assert_eq!(function, FunctionId::Esi);
        let r = Response::parse(&one_message(&reply)).unwrap();
        assert_eq!(r.function, 0x800D);
        assert_eq!(r.transaction_id, 11);
        assert!(r.status.is_success());
        assert_eq!(r.attributes, attrs);
        let scn = one_message(
            &pdu::encode_message(0x0008, flags::SERVER, 12, &attr::encode_all(&attrs)).unwrap(),
        );
        let ServerMessage::Request { reply, .. } = from_server(&scn).unwrap() else {
            panic!("SCN not recognised")
        };
        let r = Response::parse(&one_message(&reply)).unwrap();
        assert_eq!(r.attributes, attrs[..1]);
        let other = one_message(&pdu::encode_message(0x000E, flags::SERVER, 1, &[]).unwrap());
        let ServerMessage::Unsupported { reply, .. } = from_server(&other).unwrap() else {
            panic!("heartbeat handled")
        };
        assert_eq!(
            Response::parse(&one_message(&reply)).unwrap().status,
            Status(15)
        );
    }
}
