-- needle.log.tfevents: TensorBoard event files, written by hand (internal).
--
-- A tfevents file is a sequence of records (TensorFlow's TFRecord framing):
--
--   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
--
-- all little-endian, where data is a serialized tensorflow.Event protobuf and
-- masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32). The first
-- record holds Event{file_version = "brain.Event:2"}; TensorBoard reads every
-- file whose name contains "tfevents". The messages and field numbers used
-- (from tensorflow/core/util/event.proto and framework/summary.proto):
--
--   Event          wall_time 1 (double), step 2 (int64), file_version 3 (string),
--                  summary 5 (Summary)
--   Summary        value 1 (repeated Value)
--   Summary.Value  tag 1 (string), simple_value 2 (float), histo 5 (HistogramProto)
--   HistogramProto min 1, max 2, num 3, sum 4, sum_squares 5 (double),
--                  bucket_limit 6, bucket 7 (packed repeated double)
--
-- spec/log_spec.lua compares these bytes with the ones Google's protobuf
-- library writes for the same events (spec/fixtures/gen/gen_tfevents.py).
local M = {}

-- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven
local CRC_TABLE = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if c & 1 == 1 then c = (c >> 1) ~ 0x82F63B78 else c = c >> 1 end
  end
  CRC_TABLE[i] = c
end

function M.crc32c(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = CRC_TABLE[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8)
  end
  return c ~ 0xFFFFFFFF
end

function M.masked_crc(s)
  local c = M.crc32c(s)
  return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xa282ead8) & 0xFFFFFFFF
end

-- protobuf wire format: varint (0), 64-bit (1), length-delimited (2), 32-bit (5)
local function varint(n)
  local out = {}
  repeat
    local b = n & 0x7F
    n = n >> 7 -- logical shift: a negative int64 takes ten bytes, as protobuf's
    if n ~= 0 then b = b | 0x80 end
    out[#out + 1] = string.char(b)
  until n == 0
  return table.concat(out)
end
local function key(field, wire) return varint(field << 3 | wire) end
local function f_double(field, v) return key(field, 1) .. string.pack("<d", v) end
local function f_float(field, v) return key(field, 5) .. string.pack("<f", v) end
local function f_int(field, v) return key(field, 0) .. varint(v) end
local function f_bytes(field, s) return key(field, 2) .. varint(#s) .. s end
local function f_packed_doubles(field, list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = string.pack("<d", v) end
  return f_bytes(field, table.concat(parts))
end

-- proto3 leaves fields at their default (0, "") out; TensorBoard reads a
-- missing step as 0 either way, and doing the same keeps the bytes equal to
-- the protobuf library's
local function event(wall_time, step, body)
  local parts = {}
  if wall_time ~= 0 then parts[#parts + 1] = f_double(1, wall_time) end
  if step ~= 0 then parts[#parts + 1] = f_int(2, step) end
  parts[#parts + 1] = body
  return table.concat(parts)
end

function M.record(data)
  local len = string.pack("<I8", #data)
  return len .. string.pack("<I4", M.masked_crc(len)) .. data .. string.pack("<I4", M.masked_crc(data))
end

function M.file_version_event(wall_time)
  return event(wall_time, 0, f_bytes(3, "brain.Event:2"))
end

function M.scalar_event(wall_time, step, tag, value)
  local v = f_bytes(1, tag)
  if value ~= 0 or 1 / value < 0 then v = v .. f_float(2, value) end -- -0.0 is written, as protobuf does
  return event(wall_time, step, f_bytes(5, f_bytes(1, v)))
end

-- h: {min=, max=, num=, sum=, sum_squares=, bucket_limit={...}, bucket={...}}
function M.histogram_event(wall_time, step, tag, h)
  local parts = {}
  for i, name in ipairs({"min", "max", "num", "sum", "sum_squares"}) do
    local x = h[name]
    if x ~= 0 or 1 / x < 0 then parts[#parts + 1] = f_double(i, x) end
  end
  if #h.bucket_limit > 0 then parts[#parts + 1] = f_packed_doubles(6, h.bucket_limit) end
  if #h.bucket > 0 then parts[#parts + 1] = f_packed_doubles(7, h.bucket) end
  local v = f_bytes(1, tag) .. f_bytes(5, table.concat(parts))
  return event(wall_time, step, f_bytes(5, f_bytes(1, v)))
end

return M
