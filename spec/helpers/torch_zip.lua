-- spec/helpers/torch_zip.lua - small torch-style checkpoints built in Lua, for
-- specs that need a file no fixture has (budgets, globals of whole pickled
-- modules): a zip writer (stored entries with their CRC-32, or entries that
-- claim to be deflated with any bytes and sizes) and pickle pieces.
--
--   local Z = require "spec.helpers.torch_zip"
--   local pkl = Z.pickle_storages({w = {key = "0", numel = 4}})   -- {"w": <uint8 storage>}
--   local bytes = Z.zip({{name = "archive/data.pkl", data = pkl},
--                        {name = "archive/data/0", data = "\1\2\3\4"},
--                        {name = "archive/data/1", data = junk, size = 2^30, deflated = true}})
local Z = {}

local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do c = (c & 1) ~= 0 and (0xEDB88320 ~ (c >> 1)) or (c >> 1) end
  crc_table[i] = c
end

-- CRC-32 (zip's) of s
function Z.crc32(s)
  local c = 0xFFFFFFFF
  local byte, t = string.byte, crc_table
  for i = 1, #s, 4096 do
    local bs = {byte(s, i, math.min(i + 4095, #s))}
    for k = 1, #bs do c = t[(c ~ bs[k]) & 0xFF] ~ (c >> 8) end
  end
  return c ~ 0xFFFFFFFF
end

-- zip(entries) -> the archive's bytes. Each entry: {name=, data=} stored with
-- its CRC, or {name=, data=, size=, deflated = true[, crc=]}: method 8, the
-- bytes as given, claiming `size` uncompressed bytes. Sizes are ZIP64 (a
-- claim of any size fits).
function Z.zip(entries)
  local out, offsets, pos = {}, {}, 0
  local function add(s) out[#out + 1] = s; pos = pos + #s end
  local meta = {}
  for i, e in ipairs(entries) do
    local method = e.deflated and 8 or 0
    local size = e.deflated and e.size or #e.data
    local crc = e.crc or (e.deflated and 0 or Z.crc32(e.data))
    meta[i] = {method = method, size = size, crc = crc}
    offsets[i] = pos
    add(string.pack("<I4I2I2I2I4I4I4I4I2I2", 0x04034b50, 45, 0, method, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                    #e.name, 20))
    add(e.name)
    add(string.pack("<I2I2I8I8", 1, 16, size, #e.data))
    add(e.data)
  end
  local cd = pos
  for i, e in ipairs(entries) do
    local m = meta[i]
    add(string.pack("<I4I2I2I2I2I4I4I4I4I2I2I2I2I2I4I4", 0x02014b50, 45, 45, 0, m.method, 0, m.crc, 0xFFFFFFFF,
                    0xFFFFFFFF, #e.name, 28, 0, 0, 0, 0, 0xFFFFFFFF))
    add(e.name)
    add(string.pack("<I2I2I8I8I8", 1, 24, m.size, #e.data, offsets[i]))
  end
  local cd_size, z64 = pos - cd, pos
  add(string.pack("<I4I8I2I2I4I4I8I8I8I8", 0x06064b50, 44, 45, 45, 0, 0, #entries, #entries, cd_size, cd))
  add(string.pack("<I4I4I8I4", 0x07064b50, 0, z64, 1))
  add(string.pack("<I4I2I2I2I2I4I4I2", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
  return table.concat(out)
end

-- pickle pieces (protocol 2)
local function str(s) return "X" .. string.pack("<I4", #s) .. s end
Z.pickle_str = str

-- ('storage', torch.<class>, key, 'cpu', numel) as a persistent id
function Z.pickle_storage(key, numel, class)
  return "(" .. str("storage") .. "ctorch\n" .. (class or "ByteStorage") .. "\n" .. str(key) .. str("cpu")
         .. "\x8a\x08" .. string.pack("<i8", numel) .. "tQ"
end

-- {name = storage, ...} as a whole pickle: storages = {name = {key=, numel=}}
function Z.pickle_storages(storages)
  local names = {}
  for name in pairs(storages) do names[#names + 1] = name end
  table.sort(names)
  local parts = {"\x80\x02}("}
  for _, name in ipairs(names) do
    parts[#parts + 1] = str(name) .. Z.pickle_storage(storages[name].key, storages[name].numel, storages[name].class)
  end
  parts[#parts + 1] = "u."
  return table.concat(parts)
end

-- a checkpoint holding the pickle pkl and storage entries {key = bytes}
function Z.checkpoint(pkl, storages)
  local entries = {{name = "archive/data.pkl", data = pkl}}
  local keys = {}
  for k in pairs(storages or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do entries[#entries + 1] = {name = "archive/data/" .. k, data = storages[k]} end
  entries[#entries + 1] = {name = "archive/version", data = "3\n"}
  return Z.zip(entries)
end

return Z
