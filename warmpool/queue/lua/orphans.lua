-- ARGV: keys -> those dirty, not leased, and whose queued message is gone.
local out = {}
for i = 1, #ARGV do
  if orphaned(ARGV[i]) then out[#out + 1] = ARGV[i] end
end
return out
