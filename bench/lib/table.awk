# Prints bench/run's result table (markdown) from two inputs:
#   RESULTS: lines "KEY V1 V2 ..." (every successful run's value)
#   ROWS:    lines "LABEL|UNIT|DROCE_KEY|CEIL_KEY|CEIL_SCALE|BASE_KEY|BASE_SCALE|BETTER"
#            (a key of "-" means no such figure; BETTER is "higher" or "lower")
# Each cell: the median of the runs, then (min–max) when there are several.
# Variables: runs (rounds attempted), dmissing/cmissing/bmissing (what an
# empty droce/ceiling/baseline cell says; default "failed", "n/a", "n/a").
# Ratios divide medians: droce / ceiling, droce / baseline.

function sortnum(arr, n,    i, j, t) {
  for (i = 2; i <= n; i++) {
    t = arr[i]
    for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]
    arr[j + 1] = t
  }
}

# Fills med/lo/hi/cnt for KEY scaled by SCALE; returns the run count.
function summarize(key, scale,    n, v, i) {
  med = lo = hi = ""
  cnt = 0
  if (key == "-" || !(key in values)) return 0
  n = split(values[key], v, " ")
  for (i = 1; i <= n; i++) v[i] = v[i] * scale
  sortnum(v, n)
  cnt = n
  lo = v[1]
  hi = v[n]
  med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  return n
}

function num(x,    ax) {
  if (x == "") return "—"
  ax = x < 0 ? -x : x
  if (ax >= 100) return sprintf("%.0f", x)
  if (ax >= 10) return sprintf("%.1f", x)
  if (ax >= 1) return sprintf("%.2f", x)
  if (ax >= 0.01) return sprintf("%.3f", x)
  if (ax == 0) return "0"
  return sprintf("%.2g", x)
}

function cell(key, scale, missing) {
  if (key == "-") return "—"
  if (summarize(key, scale) == 0) return missing
  partial = (runs != "" && cnt < runs + 0) ? " [" cnt "/" runs "]" : ""
  if (cnt == 1) return num(med) partial
  return num(med) " (" num(lo) "–" num(hi) ")" partial
}

function ratio(a, b) {
  if (a == "" || b == "" || b == 0) return "—"
  return num(a / b) "×"
}

FNR == NR {
  key = $0
  sub(/ .*/, "", key)
  rest = substr($0, length(key) + 2)
  values[key] = rest
  next
}

{
  split($0, f, "|")
  label = f[1]; unit = f[2]; dk = f[3]; ck = f[4]; cs = f[5]; bk = f[6]; bs = f[7]
  dcell = cell(dk, 1, dmissing != "" ? dmissing : "failed")
  dmed = (dk != "-" && summarize(dk, 1)) ? med : ""
  ccell = cell(ck, cs, cmissing != "" ? cmissing : "n/a")
  cmed = (ck != "-" && summarize(ck, cs)) ? med : ""
  bcell = cell(bk, bs, bmissing != "" ? bmissing : "n/a")
  bmed = (bk != "-" && summarize(bk, bs)) ? med : ""
  rows[++nrows] = sprintf("| %s | %s | %s | %s | %s | %s | %s |", label, unit, dcell, ccell, bcell,
                          ratio(dmed, cmed), ratio(dmed, bmed))
}

END {
  print "| figure | unit | droce (perftest) | ceiling: raw DPDK memif | baseline: kernel TCP | droce/ceiling | droce/baseline |"
  print "|---|---|---|---|---|---|---|"
  for (i = 1; i <= nrows; i++) print rows[i]
}
