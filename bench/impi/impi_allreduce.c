/* A bench-time comparison only, never a dependency: a minimal MPI_Allreduce timing loop, compiled
 * with Intel MPI's mpicc by bench/compare_impi.sh, measured the way all_reduce_perf measures
 * (bench/README.md): in place, float32 sum, the buffer allocated once and touched before timing,
 * per size a barrier, warm-up iterations, timed iterations each timed alone, each rank's median,
 * the maximum over ranks; busbw = size / time * 2(n-1)/n. Writes the all_reduce_perf JSON schema
 * (rows, then a summary record; backend "intel-mpi") so bench/plot_performance.py reads it.
 * Usage: mpirun -np N impi_allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP JSON_FILE */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), compare_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 7) {
    if (rank == 0) fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP JSON\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  size_t min_bytes = strtoull(argv[1], NULL, 10), max_bytes = strtoull(argv[2], NULL, 10);
  int factor = atoi(argv[3]), iters = atoi(argv[4]), warmup = atoi(argv[5]);
  if (factor < 2 || iters < 1 || warmup < 0 || min_bytes < 4) {
    if (rank == 0) fprintf(stderr, "bad arguments\n");
    MPI_Finalize();
    return 2;
  }
  float* buffer = NULL;
  if (posix_memalign((void**)&buffer, 4096, max_bytes + 4096) != 0) MPI_Abort(MPI_COMM_WORLD, 2);
  memset(buffer, 0, max_bytes + 4096); /* first touch outside the timing; 0 is sum's fixed point */
  double* times = malloc(sizeof(double) * (size_t)iters);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int length = 0;
  MPI_Get_library_version(version, &length);
  version[strcspn(version, "\r\n")] = '\0';
  FILE* json = NULL;
  if (rank == 0) {
    json = fopen(argv[6], "w");
    if (!json) {
      perror(argv[6]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    printf("# impi_allreduce: %s\n# ranks %d, float32 sum in place, median of %d iters (%d warm-up),"
           " max over ranks\n#%12s %10s %9s %8s\n", version, n, iters, warmup, "size (B)",
           "time (us)", "algbw", "busbw");
    fprintf(json, "[\n");
  }
  const double bus = 2.0 * (n - 1) / n;
  double busbw_sum = 0;
  int rows = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= (size_t)factor) {
    const int count = (int)(bytes / sizeof(float));
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters; ++i) {
      double start = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[i] = (MPI_Wtime() - start) * 1e6;
    }
    double mine = median(times, iters), slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const size_t size = (size_t)count * sizeof(float);
    const double algbw = slowest > 0 ? (double)size / slowest / 1e3 : 0;
    busbw_sum += algbw * bus;
    if (rank == 0) {
      printf(" %12zu %10.2f %9.2f %8.2f\n", size, slowest, algbw, algbw * bus);
      fprintf(json,
              "  {\"record\": \"row\", \"collective\": \"all_reduce\", \"size\": %zu, \"count\": %d,"
              " \"type\": \"float32\", \"redop\": \"sum\", \"ranks\": %d, \"backend\": \"intel-mpi\","
              " \"time_us\": %.6f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": null},\n",
              size, count, n, slowest, algbw, algbw * bus);
    }
    ++rows;
  }
  if (rank == 0) {
    printf("# %-20s : %g \n#\n", "Avg bus bandwidth", rows ? busbw_sum / rows : 0);
    fprintf(json,
            "  {\"record\": \"summary\", \"collective\": \"all_reduce\", \"ranks\": %d, \"backend\":"
            " \"intel-mpi\", \"describe\": \"%s, I_MPI_FABRICS=%s, I_MPI_ADJUST_ALLREDUCE=%s\","
            " \"iters\": %d, \"warmup_iters\": %d, \"rows\": %d, \"avg_busbw\": %.6f}\n]\n",
            n, version, getenv("I_MPI_FABRICS") ? getenv("I_MPI_FABRICS") : "default",
            getenv("I_MPI_ADJUST_ALLREDUCE") ? getenv("I_MPI_ADJUST_ALLREDUCE") : "default", iters,
            warmup, rows, rows ? busbw_sum / rows : 0);
    fclose(json);
  }
  free(times);
  free(buffer);
  MPI_Finalize();
  return 0;
}
