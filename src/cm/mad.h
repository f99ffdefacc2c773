// Communication Management MADs (IBTA Vol. 1, chapter 12; management class
// 0x07, class version 2) and the RDMA IP CM service's private-data header
// (Annex A11): plain structs, an encoder and a checking decoder. A MAD is
// 256 bytes: the 24-byte MAD header, then the message at the offsets of
// the spec's tables 106-120 (comments give each field's byte, and bit
// offset from the byte's most significant bit). DPDK-free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

namespace droce::cm {

using Gid = std::array<uint8_t, 16>;  // the same type as wire::Ipv6Addr

inline constexpr size_t kMadSize = 256;
inline constexpr size_t kMadHeaderSize = 24;
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;  // the GSI QP's well-known Q_Key
inline constexpr uint8_t kBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;
inline constexpr uint8_t kMethodSend = 0x03;

enum class Attr : uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001A,
};

// Private data each message carries (the kernel's IB_CM_*_PRIVATE_DATA_SIZE).
inline constexpr size_t kReqPrivate = 92, kMraPrivate = 222, kRejPrivate = 148, kRepPrivate = 196,
                        kRtuPrivate = 224, kDreqPrivate = 220, kDrepPrivate = 224, kSidrReqPrivate = 216,
                        kSidrRepPrivate = 136;

// REJ reasons (table 109) droce sends or reports by name.
enum RejReason : uint16_t {
  kRejNoQp = 1,
  kRejNoResources = 3,
  kRejTimeout = 4,
  kRejInvalidCommId = 6,
  kRejInvalidServiceId = 8,
  kRejInvalidTransportType = 9,
  kRejStaleConn = 10,
  kRejInvalidGid = 12,
  kRejConsumerDefined = 28,
  kRejInvalidClassVersion = 31,
  kRejVendorOptionNotSupported = 35,
};

// MRA's and REJ's "message" fields.
enum MsgKind : uint8_t { kMsgReq = 0, kMsgRep = 1, kMsgOther = 2 };

// SIDR_REP status (table 121).
enum SidrStatus : uint8_t {
  kSidrSuccess = 0,
  kSidrUnsupported = 1,  // service ID not supported
  kSidrReject = 2,
  kSidrNoQp = 3,
  kSidrRedirect = 4,
  kSidrUnsupportedVersion = 5,
};

struct MadHeader {
  uint8_t base_version = kBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
};

// A REQ's primary or alternate path (bytes 52-95 / 96-139).
struct ReqPath {
  uint16_t local_lid = 0xFFFF, remote_lid = 0xFFFF;  // RoCE: the permissive LID
  Gid local_gid{}, remote_gid{};
  uint32_t flow_label = 0;     // 20 bits
  uint8_t packet_rate = 0;     // 6 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;              // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  // 5 bits
};

struct Req {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;  // as on the wire (big-endian bytes read as a number)
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;      // 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  uint8_t transport_type = 0;              // 2 bits: 0 RC, 1 UC, 2 RD
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;               // 24 bits
  uint8_t local_cm_response_timeout = 0;   // 5 bits
  uint8_t retry_count = 0;                 // 3 bits
  uint16_t pkey = 0xFFFF;
  uint8_t path_mtu = 0;                    // 4 bits, enum ibv_mtu
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;             // 3 bits
  uint8_t max_cm_retries = 0;              // 4 bits
  bool srq = false;
  uint8_t extended_transport_type = 0;     // 3 bits
  ReqPath primary, alternate;
  bool has_alternate = false;              // decode: alternate local LID or GID nonzero
  std::array<uint8_t, kReqPrivate> private_data{};
};

struct Mra {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_mraed = 0;   // 2 bits
  uint8_t service_timeout = 0;  // 5 bits
  std::array<uint8_t, kMraPrivate> private_data{};
};

struct Rej {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_rejected = 0;  // 2 bits
  uint8_t ari_length = 0;        // 7 bits
  uint16_t reason = 0;
  std::array<uint8_t, 72> ari{};
  std::array<uint8_t, kRejPrivate> private_data{};
};

struct Rep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;        // 24 bits
  uint32_t local_eecn = 0;       // 24 bits
  uint32_t starting_psn = 0;     // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;  // 5 bits
  uint8_t failover_accepted = 0;  // 2 bits
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;   // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivate> private_data{};
};

struct Rtu {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivate> private_data{};
};

struct Dreq {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24 bits
  std::array<uint8_t, kDreqPrivate> private_data{};
};

struct Drep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivate> private_data{};
};

struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0xFFFF;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivate> private_data{};
};

struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t additional_info_length = 0;
  uint32_t qpn = 0;  // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, 72> class_port_info{};
  std::array<uint8_t, kSidrRepPrivate> private_data{};
};

using Message = std::variant<Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep>;

struct Mad {
  MadHeader hdr;
  Message msg;
};

enum class MadError {
  kOk,
  kShort,            // fewer than 256 bytes
  kBadBaseVersion,
  kNotCm,            // another management class
  kBadClassVersion,
  kBadMethod,        // CM messages are all Send (0x03)
  kUnknownAttr,      // ClassPortInfo, LAP, APR or an unknown attribute
  kBadField,         // a reserved value (REQ transport type 3, REJ ARI longer than 72, ...)
};
const char* mad_error_name(MadError e);

// The attribute ID a message is sent as.
Attr attr_of(const Message& m);

// Writes the 256 bytes of a MAD: the header (attr_id from the message) and
// the message; reserved bits are zero.
void encode(const MadHeader& hdr, const Message& msg, std::span<uint8_t, kMadSize> out);

// Reads a MAD, checking the header and the fields with reserved values.
MadError decode(std::span<const uint8_t> in, Mad* out);

// The RDMA IP CM service (Annex A11).
inline constexpr uint16_t kPsTcp = 0x0106, kPsUdp = 0x0111, kPsIb = 0x013F, kPsIpoib = 0x0002;
inline constexpr uint64_t service_id(uint16_t ps, uint16_t port) { return (uint64_t{ps} << 16) | port; }
// The port space and port of an IP CM service ID, or false if it is not one.
bool parse_service_id(uint64_t sid, uint16_t* ps, uint16_t* port);

// The private-data header of REQ and SIDR_REQ under the IP CM service: the
// CM version (0), the IP version (4 or 6), the source port and both
// addresses as 16 bytes each (an IPv4 address in the last 4, after 12 zero
// bytes).
inline constexpr size_t kIpHeaderSize = 36;
struct IpHeader {
  uint8_t cm_version = 0;
  uint8_t ip_version = 4;
  uint16_t src_port = 0;
  Gid src{}, dst{};  // IPv4: the address in bytes 12-15, the rest zero
};
void encode_ip_header(const IpHeader& h, uint8_t* out);
// False if the version or the IP version is not one the service defines.
bool decode_ip_header(const uint8_t* in, IpHeader* out);

}  // namespace droce::cm
