#include "cm/mad.h"

#include <cstring>

#include "wire/bytes.h"

namespace droce::cm {
namespace {

// Offsets below are from the start of the message (after the MAD header).
constexpr size_t H = kMadHeaderSize;

// A field of `width` bits at bit offset `bit` of a byte (0 = the most
// significant bit), the spec's way of naming sub-byte fields.
uint8_t get_bits(uint8_t byte, unsigned bit, unsigned width) {
  return static_cast<uint8_t>((byte >> (8 - bit - width)) & ((1u << width) - 1));
}
void put_bits(uint8_t* byte, unsigned bit, unsigned width, unsigned value) {
  const unsigned shift = 8 - bit - width;
  const unsigned mask = ((1u << width) - 1) << shift;
  *byte = static_cast<uint8_t>((*byte & ~mask) | ((value << shift) & mask));
}

template <size_t N>
void put_data(uint8_t* p, const std::array<uint8_t, N>& a) {
  std::memcpy(p, a.data(), N);
}
template <size_t N>
void get_data(const uint8_t* p, std::array<uint8_t, N>* a) {
  std::memcpy(a->data(), p, N);
}

void encode_path(uint8_t* p, const ReqPath& path) {
  wire::store_be16(p + 0, path.local_lid);
  wire::store_be16(p + 2, path.remote_lid);
  std::memcpy(p + 4, path.local_gid.data(), 16);
  std::memcpy(p + 20, path.remote_gid.data(), 16);
  wire::store_be32(p + 36, (path.flow_label & 0xFFFFF) << 12);
  put_bits(p + 39, 2, 6, path.packet_rate);
  p[40] = path.traffic_class;
  p[41] = path.hop_limit;
  put_bits(p + 42, 0, 4, path.sl);
  put_bits(p + 42, 4, 1, path.subnet_local);
  put_bits(p + 43, 0, 5, path.local_ack_timeout);
}

void decode_path(const uint8_t* p, ReqPath* path) {
  path->local_lid = wire::load_be16(p);
  path->remote_lid = wire::load_be16(p + 2);
  std::memcpy(path->local_gid.data(), p + 4, 16);
  std::memcpy(path->remote_gid.data(), p + 20, 16);
  path->flow_label = wire::load_be32(p + 36) >> 12;
  path->packet_rate = get_bits(p[39], 2, 6);
  path->traffic_class = p[40];
  path->hop_limit = p[41];
  path->sl = get_bits(p[42], 0, 4);
  path->subnet_local = get_bits(p[42], 4, 1);
  path->local_ack_timeout = get_bits(p[43], 0, 5);
}

struct Encoder {
  uint8_t* m;  // the message, after the MAD header

  void operator()(const Req& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be64(m + 8, r.service_id);
    wire::store_be64(m + 16, r.local_ca_guid);
    wire::store_be32(m + 28, r.local_qkey);
    wire::store_be24(m + 32, r.local_qpn);
    m[35] = r.responder_resources;
    wire::store_be24(m + 36, r.local_eecn);
    m[39] = r.initiator_depth;
    wire::store_be24(m + 40, r.remote_eecn);
    put_bits(m + 43, 0, 5, r.remote_cm_response_timeout);
    put_bits(m + 43, 5, 2, r.transport_type);
    put_bits(m + 43, 7, 1, r.end_to_end_flow_control);
    wire::store_be24(m + 44, r.starting_psn);
    put_bits(m + 47, 0, 5, r.local_cm_response_timeout);
    put_bits(m + 47, 5, 3, r.retry_count);
    wire::store_be16(m + 48, r.pkey);
    put_bits(m + 50, 0, 4, r.path_mtu);
    put_bits(m + 50, 4, 1, r.rdc_exists);
    put_bits(m + 50, 5, 3, r.rnr_retry_count);
    put_bits(m + 51, 0, 4, r.max_cm_retries);
    put_bits(m + 51, 4, 1, r.srq);
    put_bits(m + 51, 5, 3, r.extended_transport_type);
    encode_path(m + 52, r.primary);
    if (r.has_alternate) encode_path(m + 96, r.alternate);
    put_data(m + 140, r.private_data);
  }
  void operator()(const Mra& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    put_bits(m + 8, 0, 2, r.message_mraed);
    put_bits(m + 9, 0, 5, r.service_timeout);
    put_data(m + 10, r.private_data);
  }
  void operator()(const Rej& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    put_bits(m + 8, 0, 2, r.message_rejected);
    put_bits(m + 9, 0, 7, r.ari_length);
    wire::store_be16(m + 10, r.reason);
    put_data(m + 12, r.ari);
    put_data(m + 84, r.private_data);
  }
  void operator()(const Rep& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    wire::store_be32(m + 8, r.local_qkey);
    wire::store_be24(m + 12, r.local_qpn);
    wire::store_be24(m + 16, r.local_eecn);
    wire::store_be24(m + 20, r.starting_psn);
    m[24] = r.responder_resources;
    m[25] = r.initiator_depth;
    put_bits(m + 26, 0, 5, r.target_ack_delay);
    put_bits(m + 26, 5, 2, r.failover_accepted);
    put_bits(m + 26, 7, 1, r.end_to_end_flow_control);
    put_bits(m + 27, 0, 3, r.rnr_retry_count);
    put_bits(m + 27, 3, 1, r.srq);
    wire::store_be64(m + 28, r.local_ca_guid);
    put_data(m + 36, r.private_data);
  }
  void operator()(const Rtu& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    put_data(m + 8, r.private_data);
  }
  void operator()(const Dreq& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    wire::store_be24(m + 8, r.remote_qpn);
    put_data(m + 12, r.private_data);
  }
  void operator()(const Drep& r) const {
    wire::store_be32(m + 0, r.local_comm_id);
    wire::store_be32(m + 4, r.remote_comm_id);
    put_data(m + 8, r.private_data);
  }
  void operator()(const SidrReq& r) const {
    wire::store_be32(m + 0, r.request_id);
    wire::store_be16(m + 4, r.pkey);
    wire::store_be64(m + 8, r.service_id);
    put_data(m + 16, r.private_data);
  }
  void operator()(const SidrRep& r) const {
    wire::store_be32(m + 0, r.request_id);
    m[4] = r.status;
    m[5] = r.additional_info_length;
    wire::store_be24(m + 8, r.qpn);
    wire::store_be64(m + 12, r.service_id);
    wire::store_be32(m + 20, r.qkey);
    put_data(m + 24, r.class_port_info);
    put_data(m + 96, r.private_data);
  }
};

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

const char* mad_error_name(MadError e) {
  switch (e) {
    case MadError::kOk: return "ok";
    case MadError::kShort: return "short MAD";
    case MadError::kBadBaseVersion: return "bad base version";
    case MadError::kNotCm: return "not a CM MAD";
    case MadError::kBadClassVersion: return "bad CM class version";
    case MadError::kBadMethod: return "bad method";
    case MadError::kUnknownAttr: return "unknown or unsupported attribute";
    case MadError::kBadField: return "reserved field value";
  }
  return "?";
}

Attr attr_of(const Message& m) {
  static constexpr Attr kAttrs[] = {Attr::kReq,  Attr::kMra,  Attr::kRej,     Attr::kRep,    Attr::kRtu,
                                    Attr::kDreq, Attr::kDrep, Attr::kSidrReq, Attr::kSidrRep};
  return kAttrs[m.index()];
}

void encode(const MadHeader& hdr, const Message& msg, std::span<uint8_t, kMadSize> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, kMadSize);
  p[0] = hdr.base_version;
  p[1] = hdr.mgmt_class;
  p[2] = hdr.class_version;
  p[3] = hdr.method;
  wire::store_be16(p + 4, hdr.status);
  wire::store_be16(p + 6, hdr.class_specific);
  wire::store_be64(p + 8, hdr.tid);
  wire::store_be16(p + 16, static_cast<uint16_t>(attr_of(msg)));
  wire::store_be32(p + 20, hdr.attr_mod);
  std::visit(Encoder{p + H}, msg);
}

MadError decode(std::span<const uint8_t> in, Mad* out) {
  if (in.size() < kMadSize) return MadError::kShort;
  const uint8_t* p = in.data();
  MadHeader& h = out->hdr;
  h.base_version = p[0];
  h.mgmt_class = p[1];
  h.class_version = p[2];
  h.method = p[3];
  h.status = wire::load_be16(p + 4);
  h.class_specific = wire::load_be16(p + 6);
  h.tid = wire::load_be64(p + 8);
  h.attr_id = wire::load_be16(p + 16);
  h.attr_mod = wire::load_be32(p + 20);
  if (h.base_version != kBaseVersion) return MadError::kBadBaseVersion;
  if (h.mgmt_class != kMgmtClassCm) return MadError::kNotCm;
  if (h.class_version != kCmClassVersion) return MadError::kBadClassVersion;
  if (h.method != kMethodSend) return MadError::kBadMethod;
  const uint8_t* m = p + H;
  switch (static_cast<Attr>(h.attr_id)) {
    case Attr::kReq: {
      Req r;
      r.local_comm_id = wire::load_be32(m);
      r.service_id = wire::load_be64(m + 8);
      r.local_ca_guid = wire::load_be64(m + 16);
      r.local_qkey = wire::load_be32(m + 28);
      r.local_qpn = wire::load_be24(m + 32);
      r.responder_resources = m[35];
      r.local_eecn = wire::load_be24(m + 36);
      r.initiator_depth = m[39];
      r.remote_eecn = wire::load_be24(m + 40);
      r.remote_cm_response_timeout = get_bits(m[43], 0, 5);
      r.transport_type = get_bits(m[43], 5, 2);
      r.end_to_end_flow_control = get_bits(m[43], 7, 1);
      r.starting_psn = wire::load_be24(m + 44);
      r.local_cm_response_timeout = get_bits(m[47], 0, 5);
      r.retry_count = get_bits(m[47], 5, 3);
      r.pkey = wire::load_be16(m + 48);
      r.path_mtu = get_bits(m[50], 0, 4);
      r.rdc_exists = get_bits(m[50], 4, 1);
      r.rnr_retry_count = get_bits(m[50], 5, 3);
      r.max_cm_retries = get_bits(m[51], 0, 4);
      r.srq = get_bits(m[51], 4, 1);
      r.extended_transport_type = get_bits(m[51], 5, 3);
      decode_path(m + 52, &r.primary);
      r.has_alternate = !all_zero(m + 96, 44);
      if (r.has_alternate) decode_path(m + 96, &r.alternate);
      get_data(m + 140, &r.private_data);
      if (r.transport_type == 3) return MadError::kBadField;
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kMra: {
      Mra r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      r.message_mraed = get_bits(m[8], 0, 2);
      r.service_timeout = get_bits(m[9], 0, 5);
      get_data(m + 10, &r.private_data);
      if (r.message_mraed == 3) return MadError::kBadField;
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kRej: {
      Rej r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      r.message_rejected = get_bits(m[8], 0, 2);
      r.ari_length = get_bits(m[9], 0, 7);
      r.reason = wire::load_be16(m + 10);
      get_data(m + 12, &r.ari);
      get_data(m + 84, &r.private_data);
      if (r.message_rejected == 3 || r.ari_length > r.ari.size()) return MadError::kBadField;
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kRep: {
      Rep r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      r.local_qkey = wire::load_be32(m + 8);
      r.local_qpn = wire::load_be24(m + 12);
      r.local_eecn = wire::load_be24(m + 16);
      r.starting_psn = wire::load_be24(m + 20);
      r.responder_resources = m[24];
      r.initiator_depth = m[25];
      r.target_ack_delay = get_bits(m[26], 0, 5);
      r.failover_accepted = get_bits(m[26], 5, 2);
      r.end_to_end_flow_control = get_bits(m[26], 7, 1);
      r.rnr_retry_count = get_bits(m[27], 0, 3);
      r.srq = get_bits(m[27], 3, 1);
      r.local_ca_guid = wire::load_be64(m + 28);
      get_data(m + 36, &r.private_data);
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kRtu: {
      Rtu r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      get_data(m + 8, &r.private_data);
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kDreq: {
      Dreq r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      r.remote_qpn = wire::load_be24(m + 8);
      get_data(m + 12, &r.private_data);
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kDrep: {
      Drep r;
      r.local_comm_id = wire::load_be32(m);
      r.remote_comm_id = wire::load_be32(m + 4);
      get_data(m + 8, &r.private_data);
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kSidrReq: {
      SidrReq r;
      r.request_id = wire::load_be32(m);
      r.pkey = wire::load_be16(m + 4);
      r.service_id = wire::load_be64(m + 8);
      get_data(m + 16, &r.private_data);
      out->msg = r;
      return MadError::kOk;
    }
    case Attr::kSidrRep: {
      SidrRep r;
      r.request_id = wire::load_be32(m);
      r.status = m[4];
      r.additional_info_length = m[5];
      r.qpn = wire::load_be24(m + 8);
      r.service_id = wire::load_be64(m + 12);
      r.qkey = wire::load_be32(m + 20);
      get_data(m + 24, &r.class_port_info);
      get_data(m + 96, &r.private_data);
      if (r.additional_info_length > r.class_port_info.size()) return MadError::kBadField;
      out->msg = r;
      return MadError::kOk;
    }
    default:
      return MadError::kUnknownAttr;
  }
}

bool parse_service_id(uint64_t sid, uint16_t* ps, uint16_t* port) {
  if ((sid >> 32) != 0) return false;
  const uint16_t space = static_cast<uint16_t>(sid >> 16);
  if (space != kPsTcp && space != kPsUdp && space != kPsIb && space != kPsIpoib) return false;
  *ps = space;
  *port = static_cast<uint16_t>(sid);
  return true;
}

void encode_ip_header(const IpHeader& h, uint8_t* out) {
  std::memset(out, 0, kIpHeaderSize);
  out[0] = h.cm_version;
  out[1] = static_cast<uint8_t>(h.ip_version << 4);
  wire::store_be16(out + 2, h.src_port);
  std::memcpy(out + 4, h.src.data(), 16);
  std::memcpy(out + 20, h.dst.data(), 16);
}

bool decode_ip_header(const uint8_t* in, IpHeader* out) {
  out->cm_version = in[0];
  out->ip_version = in[1] >> 4;
  out->src_port = wire::load_be16(in + 2);
  std::memcpy(out->src.data(), in + 4, 16);
  std::memcpy(out->dst.data(), in + 20, 16);
  return out->cm_version == 0 && (out->ip_version == 4 || out->ip_version == 6);
}

}  // namespace droce::cm
