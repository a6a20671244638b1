-- (filled by its commit)
return {install = function(nd, core) end}
