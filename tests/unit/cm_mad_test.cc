// CM MADs against golden bytes written field by field from the IBTA Vol. 1
// chapter 12 tables (REQ table 106, MRA 107, REJ 108, REP 110, RTU 111, DREQ
// 112, DREP 113, SIDR_REQ 119, SIDR_REP 120) and the MAD header (13.4.3):
// each expected byte below is placed by its table offset (message bytes
// start after the 24-byte MAD header), not by droce's encoder.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "cm/mad.h"

namespace droce::cm {
namespace {

using Bytes = std::array<uint8_t, kMadSize>;

// A MAD with the common header of a CM Send: base version 1, class 0x07,
// class version 2, method 0x03, TID 0x0102030405060708, the attribute.
Bytes header(uint16_t attr) {
  Bytes b{};
  b[0] = 0x01;
  b[1] = 0x07;
  b[2] = 0x02;
  b[3] = 0x03;
  for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(i + 1);
  b[16] = static_cast<uint8_t>(attr >> 8);
  b[17] = static_cast<uint8_t>(attr);
  return b;
}

// Message byte `off` (table offset) of the MAD.
uint8_t& at(Bytes& b, size_t off) { return b[24 + off]; }
void put(Bytes& b, size_t off, std::initializer_list<uint8_t> v) {
  size_t i = 0;
  for (uint8_t x : v) at(b, off + i++) = x;
}

MadHeader hdr() {
  MadHeader h;
  h.tid = 0x0102030405060708ull;
  return h;
}

Bytes encoded(const Message& m) {
  Bytes b;
  encode(hdr(), m, b);
  return b;
}

Gid gid4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) { return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d}; }

TEST(CmMad, ReqMatchesTable106) {
  Req r;
  r.local_comm_id = 0x11223344;
  r.service_id = service_id(kPsTcp, 7174);  // 0x0000000001061C06
  r.local_ca_guid = 0x02000AFFFE4E0001ull;
  r.local_qpn = 0x000012;
  r.responder_resources = 16;
  r.initiator_depth = 16;
  r.remote_cm_response_timeout = 20;
  r.transport_type = 0;
  r.starting_psn = 0xABCDEF;
  r.local_cm_response_timeout = 20;
  r.retry_count = 7;
  r.pkey = 0xFFFF;
  r.path_mtu = 3;
  r.rnr_retry_count = 7;
  r.max_cm_retries = 15;
  r.primary.local_gid = gid4(10, 78, 0, 2);
  r.primary.remote_gid = gid4(10, 78, 0, 1);
  r.primary.hop_limit = 64;
  r.primary.traffic_class = 0x20;
  r.primary.flow_label = 0xABCDE;
  r.primary.packet_rate = 0x2F;
  r.primary.sl = 5;
  r.primary.local_ack_timeout = 17;
  IpHeader ih;
  ih.ip_version = 4;
  ih.src_port = 0xC001;
  ih.src = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 78, 0, 2};
  ih.dst = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 78, 0, 1};
  encode_ip_header(ih, r.private_data.data());
  r.private_data[36] = 0x5A;  // the user's first private byte

  Bytes want = header(0x0010);
  put(want, 0, {0x11, 0x22, 0x33, 0x44});                          // Local Communication ID
  put(want, 8, {0, 0, 0, 0, 0x01, 0x06, 0x1C, 0x06});              // ServiceID
  put(want, 16, {0x02, 0x00, 0x0A, 0xFF, 0xFE, 0x4E, 0x00, 0x01}); // Local CA GUID
  put(want, 32, {0x00, 0x00, 0x12});                               // Local QPN
  at(want, 35) = 16;                                               // Responder Resources
  at(want, 39) = 16;                                               // Initiator Depth
  at(want, 43) = 20 << 3;                                          // Remote CM Response Timeout | TST RC | E2E 0
  put(want, 44, {0xAB, 0xCD, 0xEF});                               // Starting PSN
  at(want, 47) = (20 << 3) | 7;                                    // Local CM Response Timeout | Retry Count
  put(want, 48, {0xFF, 0xFF});                                     // Partition Key
  at(want, 50) = (3 << 4) | 7;                                     // Path MTU | RDC 0 | RNR Retry Count
  at(want, 51) = 15 << 4;                                          // Max CM Retries | SRQ 0 | Ext TST 0
  put(want, 52, {0xFF, 0xFF, 0xFF, 0xFF});                         // Primary local/remote port LID (permissive)
  put(want, 56, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 78, 0, 2});  // Primary Local Port GID
  put(want, 72, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 78, 0, 1});  // Primary Remote Port GID
  put(want, 88, {0xAB, 0xCD, 0xE0});                               // Primary Flow Label (20 bits)
  at(want, 91) = 0x2F;                                             // Primary Packet Rate (6 bits)
  at(want, 92) = 0x20;                                             // Primary Traffic Class
  at(want, 93) = 64;                                               // Primary Hop Limit
  at(want, 94) = 5 << 4;                                           // Primary SL | Subnet Local 0
  at(want, 95) = 17 << 3;                                          // Primary Local ACK Timeout
  // Private data at 140: the IP CM header (Annex A11): version 0, IP
  // version 4 in the high nibble, source port, source and destination.
  at(want, 140) = 0x00;
  at(want, 141) = 0x40;
  put(want, 142, {0xC0, 0x01});
  put(want, 144 + 12, {10, 78, 0, 2});
  put(want, 160 + 12, {10, 78, 0, 1});
  at(want, 176) = 0x5A;
  EXPECT_EQ(encoded(r), want);

  Mad m;
  ASSERT_EQ(decode(want, &m), MadError::kOk);
  const Req& d = std::get<Req>(m.msg);
  EXPECT_EQ(m.hdr.tid, 0x0102030405060708ull);
  EXPECT_EQ(d.local_comm_id, r.local_comm_id);
  EXPECT_EQ(d.service_id, r.service_id);
  EXPECT_EQ(d.local_ca_guid, r.local_ca_guid);
  EXPECT_EQ(d.local_qpn, r.local_qpn);
  EXPECT_EQ(d.starting_psn, r.starting_psn);
  EXPECT_EQ(d.retry_count, 7);
  EXPECT_EQ(d.rnr_retry_count, 7);
  EXPECT_EQ(d.max_cm_retries, 15);
  EXPECT_EQ(d.path_mtu, 3);
  EXPECT_EQ(d.remote_cm_response_timeout, 20);
  EXPECT_EQ(d.local_cm_response_timeout, 20);
  EXPECT_EQ(d.primary.flow_label, 0xABCDEu);
  EXPECT_EQ(d.primary.packet_rate, 0x2F);
  EXPECT_EQ(d.primary.sl, 5);
  EXPECT_EQ(d.primary.local_ack_timeout, 17);
  EXPECT_EQ(d.primary.remote_gid, r.primary.remote_gid);
  EXPECT_FALSE(d.has_alternate);
  IpHeader dh;
  ASSERT_TRUE(decode_ip_header(d.private_data.data(), &dh));
  EXPECT_EQ(dh.ip_version, 4);
  EXPECT_EQ(dh.src_port, 0xC001);
  EXPECT_EQ(dh.dst, ih.dst);
}

TEST(CmMad, RepMatchesTable110) {
  Rep r;
  r.local_comm_id = 0xA1A2A3A4;
  r.remote_comm_id = 0x11223344;
  r.local_qkey = 0;
  r.local_qpn = 0x000013;
  r.starting_psn = 0x123456;
  r.responder_resources = 4;
  r.initiator_depth = 8;
  r.target_ack_delay = 15;
  r.failover_accepted = 0;
  r.end_to_end_flow_control = true;
  r.rnr_retry_count = 7;
  r.srq = true;
  r.local_ca_guid = 0x02000AFFFE4E0002ull;
  r.private_data[0] = 0x77;
  Bytes want = header(0x0013);
  put(want, 0, {0xA1, 0xA2, 0xA3, 0xA4});
  put(want, 4, {0x11, 0x22, 0x33, 0x44});
  put(want, 12, {0x00, 0x00, 0x13});                         // Local QPN
  put(want, 20, {0x12, 0x34, 0x56});                         // Starting PSN
  at(want, 24) = 4;                                          // Responder Resources
  at(want, 25) = 8;                                          // Initiator Depth
  at(want, 26) = (15 << 3) | 1;                              // Target ACK Delay | Failover 0 | E2E 1
  at(want, 27) = (7 << 5) | (1 << 4);                        // RNR Retry Count | SRQ
  put(want, 28, {0x02, 0x00, 0x0A, 0xFF, 0xFE, 0x4E, 0x00, 0x02});
  at(want, 36) = 0x77;                                       // Private Data
  EXPECT_EQ(encoded(r), want);
  Mad m;
  ASSERT_EQ(decode(want, &m), MadError::kOk);
  const Rep& d = std::get<Rep>(m.msg);
  EXPECT_EQ(d.local_qpn, 0x13u);
  EXPECT_EQ(d.starting_psn, 0x123456u);
  EXPECT_EQ(d.target_ack_delay, 15);
  EXPECT_TRUE(d.end_to_end_flow_control);
  EXPECT_EQ(d.rnr_retry_count, 7);
  EXPECT_TRUE(d.srq);
  EXPECT_EQ(d.local_ca_guid, r.local_ca_guid);
}

TEST(CmMad, RejMraRtuDreqDrepMatchTheirTables) {
  {
    Rej r;
    r.local_comm_id = 0;
    r.remote_comm_id = 0x11223344;
    r.message_rejected = kMsgReq;
    r.reason = kRejInvalidServiceId;
    r.private_data[147] = 0xEE;
    Bytes want = header(0x0012);
    put(want, 4, {0x11, 0x22, 0x33, 0x44});
    at(want, 8) = 0 << 6;   // Message REJected: REQ
    at(want, 9) = 0 << 1;   // Reject Info Length
    put(want, 10, {0x00, 0x08});  // Reason 8: invalid Service ID
    at(want, 84 + 147) = 0xEE;    // last private byte (148 from offset 84)
    EXPECT_EQ(encoded(r), want);
  }
  {
    Mra m;
    m.local_comm_id = 1;
    m.remote_comm_id = 2;
    m.message_mraed = kMsgRep;
    m.service_timeout = 20;
    Bytes want = header(0x0011);
    put(want, 0, {0, 0, 0, 1});
    put(want, 4, {0, 0, 0, 2});
    at(want, 8) = 1 << 6;    // Message MRAed: REP
    at(want, 9) = 20 << 3;   // Service Timeout
    EXPECT_EQ(encoded(m), want);
  }
  {
    Rtu r;
    r.local_comm_id = 3;
    r.remote_comm_id = 4;
    r.private_data[0] = 9;
    Bytes want = header(0x0014);
    put(want, 0, {0, 0, 0, 3});
    put(want, 4, {0, 0, 0, 4});
    at(want, 8) = 9;
    EXPECT_EQ(encoded(r), want);
  }
  {
    Dreq d;
    d.local_comm_id = 5;
    d.remote_comm_id = 6;
    d.remote_qpn = 0xABCDEF;
    Bytes want = header(0x0015);
    put(want, 0, {0, 0, 0, 5});
    put(want, 4, {0, 0, 0, 6});
    put(want, 8, {0xAB, 0xCD, 0xEF});  // Remote QPN/EECN
    EXPECT_EQ(encoded(d), want);
  }
  {
    Drep d;
    d.local_comm_id = 7;
    d.remote_comm_id = 8;
    Bytes want = header(0x0016);
    put(want, 0, {0, 0, 0, 7});
    put(want, 4, {0, 0, 0, 8});
    EXPECT_EQ(encoded(d), want);
  }
}

TEST(CmMad, SidrMatchesTables119And120) {
  SidrReq q;
  q.request_id = 0x01020304;
  q.pkey = 0xFFFF;
  q.service_id = service_id(kPsUdp, 7174);  // 0x0000000001111C06
  Bytes want = header(0x0017);
  put(want, 0, {1, 2, 3, 4});
  put(want, 4, {0xFF, 0xFF});
  put(want, 8, {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06});
  EXPECT_EQ(encoded(q), want);

  SidrRep p;
  p.request_id = 0x01020304;
  p.status = kSidrSuccess;
  p.qpn = 0x000020;
  p.service_id = q.service_id;
  p.qkey = 0x01234567;
  p.private_data[0] = 0x42;
  want = header(0x0018);
  put(want, 0, {1, 2, 3, 4});
  at(want, 4) = 0;                                     // Status
  put(want, 8, {0x00, 0x00, 0x20});                    // QPN
  put(want, 12, {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06}); // ServiceID
  put(want, 20, {0x01, 0x23, 0x45, 0x67});             // Q_Key
  at(want, 96) = 0x42;                                 // Private Data
  EXPECT_EQ(encoded(p), want);
  Mad m;
  ASSERT_EQ(decode(want, &m), MadError::kOk);
  EXPECT_EQ(std::get<SidrRep>(m.msg).qkey, 0x01234567u);
}

TEST(CmMad, DecodeRefusesWhatIsNotACmSend) {
  Bytes ok = header(0x0014);
  Mad m;
  EXPECT_EQ(decode(ok, &m), MadError::kOk);
  EXPECT_EQ(decode(std::span<const uint8_t>(ok.data(), 255), &m), MadError::kShort);
  Bytes b = ok;
  b[0] = 2;
  EXPECT_EQ(decode(b, &m), MadError::kBadBaseVersion);
  b = ok;
  b[1] = 0x03;  // SA
  EXPECT_EQ(decode(b, &m), MadError::kNotCm);
  b = ok;
  b[2] = 1;
  EXPECT_EQ(decode(b, &m), MadError::kBadClassVersion);
  b = ok;
  b[3] = 0x01;  // Get
  EXPECT_EQ(decode(b, &m), MadError::kBadMethod);
  for (uint16_t attr : {0x0001, 0x0019, 0x001A, 0x00FF, 0xFFFF}) {
    b = header(attr);
    EXPECT_EQ(decode(b, &m), MadError::kUnknownAttr) << attr;
  }
  b = header(0x0012);
  at(b, 9) = 73 << 1;  // REJ: ARI longer than its 72 bytes
  EXPECT_EQ(decode(b, &m), MadError::kBadField);
  b = header(0x0010);
  at(b, 43) = 3 << 1;  // REQ: transport service type 3 is reserved
  EXPECT_EQ(decode(b, &m), MadError::kBadField);
}

TEST(CmMad, ServiceIdsOfThePortSpaces) {
  EXPECT_EQ(service_id(kPsTcp, 1), 0x0000000001060001ull);
  EXPECT_EQ(service_id(kPsUdp, 0xFFFF), 0x000000000111FFFFull);
  EXPECT_EQ(service_id(kPsIb, 2), 0x00000000013F0002ull);
  uint16_t ps, port;
  EXPECT_TRUE(parse_service_id(0x0000000001061C06ull, &ps, &port));
  EXPECT_EQ(ps, kPsTcp);
  EXPECT_EQ(port, 7174);
  EXPECT_FALSE(parse_service_id(0x1000000001061C06ull, &ps, &port));  // not the IP CM service
  EXPECT_FALSE(parse_service_id(0x0000000001071C06ull, &ps, &port));  // no such port space
}

}  // namespace
}  // namespace droce::cm
