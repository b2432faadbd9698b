//! [`Pdu`]: any PDU header, typed, and its decoding from and encoding to a
//! [`Bhs`] (RFC 7143 §11).

use super::*;
/// Any PDU header, typed. The data segment travels beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Pdu {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    Snack(Snack),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl Pdu {
    /// Decode a header. Data-segment lengths are not checked here: the
    /// framing layer compares [`Bhs::data_len`] with the negotiated limit.
    pub fn decode(b: &Bhs) -> Result<Pdu, PduError> {
        let imm = b.immediate();
        let f = b.final_bit();
        let b1 = b.0[1];
        let lun = b.u64_at(8);
        let itt = b.itt();
        Ok(match b.opcode() {
            opcode::NOP_OUT => Pdu::NopOut(NopOut {
                immediate: imm,
                lun,
                itt,
                ttt: b.u32_at(20),
                cmd_sn: b.u32_at(24),
                exp_stat_sn: b.u32_at(28),
            }),
            opcode::SCSI_COMMAND => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&b.0[32..48]);
                Pdu::ScsiCommand(ScsiCommand {
                    immediate: imm,
                    final_bit: f,
                    read: b1 & 0x40 != 0,
                    write: b1 & 0x20 != 0,
                    attr: TaskAttr::from_bits(b1),
                    lun,
                    itt,
                    expected_len: b.u32_at(20),
                    cmd_sn: b.u32_at(24),
                    exp_stat_sn: b.u32_at(28),
                    cdb,
                })
            }
            opcode::TASK_MGMT_REQUEST => Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: TmfFunction::from_code(b1 & 0x7f),
                lun,
                itt,
                referenced_task_tag: b.u32_at(20),
                cmd_sn: b.u32_at(24),
                exp_stat_sn: b.u32_at(28),
                ref_cmd_sn: b.u32_at(32),
                exp_data_sn: b.u32_at(36),
            }),
            opcode::LOGIN_REQUEST => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b.0[8..14]);
                Pdu::LoginRequest(LoginRequest {
                    transit: f,
                    continue_bit: b1 & 0x40 != 0,
                    csg: (b1 >> 2) & 3,
                    nsg: b1 & 3,
                    version_max: b.0[2],
                    version_min: b.0[3],
                    isid,
                    tsih: b.u16_at(14),
                    itt,
                    cid: b.u16_at(20),
                    cmd_sn: b.u32_at(24),
                    exp_stat_sn: b.u32_at(28),
                })
            }
            opcode::TEXT_REQUEST => Pdu::TextRequest(TextRequest {
                immediate: imm,
                final_bit: f,
                continue_bit: b1 & 0x40 != 0,
                lun,
                itt,
                ttt: b.u32_at(20),
                cmd_sn: b.u32_at(24),
                exp_stat_sn: b.u32_at(28),
            }),
            opcode::DATA_OUT => Pdu::DataOut(DataOut {
                final_bit: f,
                lun,
                itt,
                ttt: b.u32_at(20),
                exp_stat_sn: b.u32_at(28),
                data_sn: b.u32_at(36),
                buffer_offset: b.u32_at(40),
            }),
            opcode::LOGOUT_REQUEST => Pdu::LogoutRequest(LogoutRequest {
                immediate: imm,
                reason: b1 & 0x7f,
                itt,
                cid: b.u16_at(20),
                cmd_sn: b.u32_at(24),
                exp_stat_sn: b.u32_at(28),
            }),
            opcode::SNACK => Pdu::Snack(Snack {
                snack_type: b1 & 0x0f,
                lun,
                itt,
                ttt: b.u32_at(20),
                exp_stat_sn: b.u32_at(28),
                beg_run: b.u32_at(40),
                run_length: b.u32_at(44),
            }),
            opcode::NOP_IN => Pdu::NopIn(NopIn {
                lun,
                itt,
                ttt: b.u32_at(20),
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
            }),
            opcode::SCSI_RESPONSE => Pdu::ScsiResponse(ScsiResponse {
                bidi_overflow: b1 & 0x10 != 0,
                bidi_underflow: b1 & 0x08 != 0,
                overflow: b1 & 0x04 != 0,
                underflow: b1 & 0x02 != 0,
                response: b.0[2],
                status: b.0[3],
                itt,
                snack_tag: b.u32_at(20),
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                exp_data_sn: b.u32_at(36),
                bidi_residual: b.u32_at(40),
                residual: b.u32_at(44),
            }),
            opcode::TASK_MGMT_RESPONSE => Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: b.0[2],
                itt,
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
            }),
            opcode::LOGIN_RESPONSE => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b.0[8..14]);
                Pdu::LoginResponse(LoginResponse {
                    transit: f,
                    continue_bit: b1 & 0x40 != 0,
                    csg: (b1 >> 2) & 3,
                    nsg: b1 & 3,
                    version_max: b.0[2],
                    version_active: b.0[3],
                    isid,
                    tsih: b.u16_at(14),
                    itt,
                    stat_sn: b.u32_at(24),
                    exp_cmd_sn: b.u32_at(28),
                    max_cmd_sn: b.u32_at(32),
                    status_class: b.0[36],
                    status_detail: b.0[37],
                })
            }
            opcode::TEXT_RESPONSE => Pdu::TextResponse(TextResponse {
                final_bit: f,
                continue_bit: b1 & 0x40 != 0,
                lun,
                itt,
                ttt: b.u32_at(20),
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
            }),
            opcode::DATA_IN => Pdu::DataIn(DataIn {
                final_bit: f,
                ack: b1 & 0x40 != 0,
                overflow: b1 & 0x04 != 0,
                underflow: b1 & 0x02 != 0,
                status_present: b1 & 0x01 != 0,
                // Status, StatSN and the residual count mean something only
                // with the S bit (§11.7); otherwise they are ignored.
                status: if b1 & 0x01 != 0 { b.0[3] } else { 0 },
                lun,
                itt,
                ttt: b.u32_at(20),
                stat_sn: if b1 & 0x01 != 0 { b.u32_at(24) } else { 0 },
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                data_sn: b.u32_at(36),
                buffer_offset: b.u32_at(40),
                residual: if b1 & 0x01 != 0 { b.u32_at(44) } else { 0 },
            }),
            opcode::LOGOUT_RESPONSE => Pdu::LogoutResponse(LogoutResponse {
                response: b.0[2],
                itt,
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                time2wait: b.u16_at(40),
                time2retain: b.u16_at(42),
            }),
            opcode::R2T => Pdu::R2t(R2t {
                lun,
                itt,
                ttt: b.u32_at(20),
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                r2t_sn: b.u32_at(36),
                buffer_offset: b.u32_at(40),
                desired_len: b.u32_at(44),
            }),
            opcode::ASYNC_MESSAGE => Pdu::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                event: b.0[36],
                vcode: b.0[37],
                params: [b.u16_at(38), b.u16_at(40), b.u16_at(42)],
            }),
            opcode::REJECT => Pdu::Reject(Reject {
                reason: b.0[2],
                stat_sn: b.u32_at(24),
                exp_cmd_sn: b.u32_at(28),
                max_cmd_sn: b.u32_at(32),
                data_sn: b.u32_at(36),
            }),
            other => return Err(PduError::UnknownOpcode(other)),
        })
    }

    /// Encode into a BHS with the given data segment length (the caller
    /// sends the data segment, padded, after the header).
    pub fn encode(&self, data_len: u32) -> Bhs {
        let mut b = Bhs::default();
        let imm = |b: &mut Bhs, i: bool| {
            if i {
                b.0[0] |= 0x40
            }
        };
        match self {
            Pdu::NopOut(p) => {
                b.0[0] = opcode::NOP_OUT;
                imm(&mut b, p.immediate);
                b.0[1] = 0x80;
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
            }
            Pdu::ScsiCommand(p) => {
                b.0[0] = opcode::SCSI_COMMAND;
                imm(&mut b, p.immediate);
                b.0[1] = (if p.final_bit { 0x80 } else { 0 })
                    | (if p.read { 0x40 } else { 0 })
                    | (if p.write { 0x20 } else { 0 })
                    | p.attr.bits();
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.expected_len);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
                b.0[32..48].copy_from_slice(&p.cdb);
            }
            Pdu::TaskMgmtRequest(p) => {
                b.0[0] = opcode::TASK_MGMT_REQUEST;
                imm(&mut b, p.immediate);
                b.0[1] = 0x80 | p.function.code();
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.referenced_task_tag);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
                b.put_u32(32, p.ref_cmd_sn);
                b.put_u32(36, p.exp_data_sn);
            }
            Pdu::LoginRequest(p) => {
                b.0[0] = opcode::LOGIN_REQUEST | 0x40;
                b.0[1] = login_flags(p.transit, p.continue_bit, p.csg, p.nsg);
                b.0[2] = p.version_max;
                b.0[3] = p.version_min;
                b.0[8..14].copy_from_slice(&p.isid);
                b.put_u16(14, p.tsih);
                b.put_u32(16, p.itt);
                b.put_u16(20, p.cid);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
            }
            Pdu::TextRequest(p) => {
                b.0[0] = opcode::TEXT_REQUEST;
                imm(&mut b, p.immediate);
                b.0[1] =
                    (if p.final_bit { 0x80 } else { 0 }) | (if p.continue_bit { 0x40 } else { 0 });
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
            }
            Pdu::DataOut(p) => {
                b.0[0] = opcode::DATA_OUT;
                b.0[1] = if p.final_bit { 0x80 } else { 0 };
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(28, p.exp_stat_sn);
                b.put_u32(36, p.data_sn);
                b.put_u32(40, p.buffer_offset);
            }
            Pdu::LogoutRequest(p) => {
                b.0[0] = opcode::LOGOUT_REQUEST;
                imm(&mut b, p.immediate);
                b.0[1] = 0x80 | (p.reason & 0x7f);
                b.put_u32(16, p.itt);
                b.put_u16(20, p.cid);
                b.put_u32(24, p.cmd_sn);
                b.put_u32(28, p.exp_stat_sn);
            }
            Pdu::Snack(p) => {
                b.0[0] = opcode::SNACK;
                b.0[1] = 0x80 | (p.snack_type & 0x0f);
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(28, p.exp_stat_sn);
                b.put_u32(40, p.beg_run);
                b.put_u32(44, p.run_length);
            }
            Pdu::NopIn(p) => {
                b.0[0] = opcode::NOP_IN;
                b.0[1] = 0x80;
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
            }
            Pdu::ScsiResponse(p) => {
                b.0[0] = opcode::SCSI_RESPONSE;
                b.0[1] = 0x80
                    | (if p.bidi_overflow { 0x10 } else { 0 })
                    | (if p.bidi_underflow { 0x08 } else { 0 })
                    | (if p.overflow { 0x04 } else { 0 })
                    | (if p.underflow { 0x02 } else { 0 });
                b.0[2] = p.response;
                b.0[3] = p.status;
                b.put_u32(16, p.itt);
                b.put_u32(20, p.snack_tag);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.put_u32(36, p.exp_data_sn);
                b.put_u32(40, p.bidi_residual);
                b.put_u32(44, p.residual);
            }
            Pdu::TaskMgmtResponse(p) => {
                b.0[0] = opcode::TASK_MGMT_RESPONSE;
                b.0[1] = 0x80;
                b.0[2] = p.response;
                b.put_u32(16, p.itt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
            }
            Pdu::LoginResponse(p) => {
                b.0[0] = opcode::LOGIN_RESPONSE;
                b.0[1] = login_flags(p.transit, p.continue_bit, p.csg, p.nsg);
                b.0[2] = p.version_max;
                b.0[3] = p.version_active;
                b.0[8..14].copy_from_slice(&p.isid);
                b.put_u16(14, p.tsih);
                b.put_u32(16, p.itt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.0[36] = p.status_class;
                b.0[37] = p.status_detail;
            }
            Pdu::TextResponse(p) => {
                b.0[0] = opcode::TEXT_RESPONSE;
                b.0[1] =
                    (if p.final_bit { 0x80 } else { 0 }) | (if p.continue_bit { 0x40 } else { 0 });
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
            }
            Pdu::DataIn(p) => {
                b.0[0] = opcode::DATA_IN;
                b.0[1] = (if p.final_bit { 0x80 } else { 0 })
                    | (if p.ack { 0x40 } else { 0 })
                    | (if p.overflow { 0x04 } else { 0 })
                    | (if p.underflow { 0x02 } else { 0 })
                    | (if p.status_present { 0x01 } else { 0 });
                if p.status_present {
                    b.0[3] = p.status;
                    b.put_u32(24, p.stat_sn);
                    b.put_u32(44, p.residual);
                }
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.put_u32(36, p.data_sn);
                b.put_u32(40, p.buffer_offset);
            }
            Pdu::LogoutResponse(p) => {
                b.0[0] = opcode::LOGOUT_RESPONSE;
                b.0[1] = 0x80;
                b.0[2] = p.response;
                b.put_u32(16, p.itt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.put_u16(40, p.time2wait);
                b.put_u16(42, p.time2retain);
            }
            Pdu::R2t(p) => {
                b.0[0] = opcode::R2T;
                b.0[1] = 0x80;
                b.put_u64(8, p.lun);
                b.put_u32(16, p.itt);
                b.put_u32(20, p.ttt);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.put_u32(36, p.r2t_sn);
                b.put_u32(40, p.buffer_offset);
                b.put_u32(44, p.desired_len);
            }
            Pdu::AsyncMessage(p) => {
                b.0[0] = opcode::ASYNC_MESSAGE;
                b.0[1] = 0x80;
                b.put_u64(8, p.lun);
                b.put_u32(16, RESERVED_TAG);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.0[36] = p.event;
                b.0[37] = p.vcode;
                b.put_u16(38, p.params[0]);
                b.put_u16(40, p.params[1]);
                b.put_u16(42, p.params[2]);
            }
            Pdu::Reject(p) => {
                b.0[0] = opcode::REJECT;
                b.0[1] = 0x80;
                b.0[2] = p.reason;
                b.put_u32(16, RESERVED_TAG);
                b.put_u32(24, p.stat_sn);
                b.put_u32(28, p.exp_cmd_sn);
                b.put_u32(32, p.max_cmd_sn);
                b.put_u32(36, p.data_sn);
            }
        }
        b.set_data_len(data_len);
        b
    }
}

fn login_flags(t: bool, c: bool, csg: u8, nsg: u8) -> u8 {
    (if t { 0x80 } else { 0 }) | (if c { 0x40 } else { 0 }) | ((csg & 3) << 2) | (nsg & 3)
}
