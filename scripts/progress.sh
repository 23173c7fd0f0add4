# Sourced by build.sh and test.sh: runs a long build command with its whole
# output kept in a log file and only its progress shown (CMake's configure
# summary, "[ 42%] Building CXX object ..." lines, errors); the log's tail is
# shown when the command fails. Usage: with_progress LOG command [args...]
with_progress() {
  local log=$1
  shift
  mkdir -p "$(dirname "$log")"
  echo "   (full output: $log)"
  # The command's own status decides, not the filter's (which fails when
  # nothing matches): it is passed on through a file.
  { "$@" 2>&1; echo $? > "$log.status"; } | tee "$log" | grep --line-buffered -E \
    '^ *(\[ *[0-9]+%\]|-- (Configuring done|Generating done|Build files)|.*(error|Error|FAILED))' \
    | sed -u 's/^ */   /' || true
  local status
  status=$(cat "$log.status")
  rm -f "$log.status"
  if [ "$status" -ne 0 ]; then
    echo "== failed (status $status); the last lines of $log:"
    tail -40 "$log"
  fi
  return "$status"
}
