// An MPI job's basic traffic with every byte checked: ping-pong between
// ranks 0 and 1, an allreduce, and a non-blocking exchange around a ring.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char* what, int rank) {
  fprintf(stderr, "rank %d: FAIL: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int sizes[] = {1, 64, 4096, 65536, 1 << 20};
  char* buf = malloc(1 << 20);
  // Ping-pong 0 <-> 1, each size, the payload a function of size and turn.
  for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
    const int n = sizes[s];
    for (int it = 0; it < 20; ++it) {
      const char v = (char)(n + it);
      if (rank == 0) {
        memset(buf, v, n);
        MPI_Send(buf, n, MPI_CHAR, 1, it, MPI_COMM_WORLD);
        memset(buf, 0, n);
        MPI_Recv(buf, n, MPI_CHAR, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < n; ++i) if (buf[i] != (char)(v + 1)) return fail("ping-pong data", rank);
      } else if (rank == 1) {
        MPI_Recv(buf, n, MPI_CHAR, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < n; ++i) if (buf[i] != v) return fail("ping-pong data", rank);
        memset(buf, v + 1, n);
        MPI_Send(buf, n, MPI_CHAR, 0, it, MPI_COMM_WORLD);
      }
    }
  }
  // Allreduce of 100k longs: element i of rank r is r * i.
  const int count = 100000;
  long* in = malloc(count * sizeof(long));
  long* out = malloc(count * sizeof(long));
  for (int i = 0; i < count; ++i) in[i] = (long)rank * i;
  MPI_Allreduce(in, out, count, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const long ranks_sum = (long)size * (size - 1) / 2;
  for (int i = 0; i < count; ++i) if (out[i] != ranks_sum * i) return fail("allreduce", rank);
  // Non-blocking exchange with both ring neighbours, 256 KiB each way.
  const int m = 1 << 18;
  char *to_l = malloc(m), *to_r = malloc(m), *from_l = malloc(m), *from_r = malloc(m);
  const int left = (rank + size - 1) % size, right = (rank + 1) % size;
  memset(to_l, 'L' + rank, m);
  memset(to_r, 'R' + rank, m);
  MPI_Request req[4];
  MPI_Irecv(from_l, m, MPI_CHAR, left, 7, MPI_COMM_WORLD, &req[0]);
  MPI_Irecv(from_r, m, MPI_CHAR, right, 8, MPI_COMM_WORLD, &req[1]);
  MPI_Isend(to_l, m, MPI_CHAR, left, 8, MPI_COMM_WORLD, &req[2]);
  MPI_Isend(to_r, m, MPI_CHAR, right, 7, MPI_COMM_WORLD, &req[3]);
  MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
  for (int i = 0; i < m; ++i) {
    if (from_l[i] != (char)('R' + left) || from_r[i] != (char)('L' + right)) return fail("exchange", rank);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_check: %d ranks: ping-pong, allreduce, exchange OK\n", size);
  MPI_Finalize();
  return 0;
}
