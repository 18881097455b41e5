// Test double of Foundation and <malloc/malloc.h> for Linux (declared by dev/apple_doubles/include), over libobjc2.
// Manual reference counting, as Apple's Foundation is written: this file is compiled without ARC (every other file
// of the double, and the code under test, uses ARC, which calls objc_retain/objc_release directly).
//
//  - NSObject is the root class. Instances come from class_createInstance; retain, release and autorelease go to
//    the runtime's inline reference count (libobjc2 takes the fast path for classes marked
//    -_ARCCompliantRetainRelease). Every live instance is registered as a heap block, so malloc_zone_from_ptr and
//    malloc_size answer for objects as Apple's do; for any other pointer the zone is NULL.
//  - String literals: gnustep-2.0 emits NSConstantString structures, and strings of up to 8 ASCII characters as
//    tagged pointers (tag 4: the length in bits 3-6, 7-bit characters from bit 63 down), registered here.
//  - Immutable collections copy by retaining; NSMutableArray is the only mutable class.
#import <Foundation/Foundation.h>
#include <malloc/malloc.h>
#import <objc/objc-arc.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#if __has_feature(objc_arc)
#error "foundation.mm is manual reference counting (compile with -fno-objc-arc)"
#endif

namespace {

// ---- heap-block registry (malloc zones) ---------------------------------------------------------------------
struct BlockRegistry {
  std::mutex mu;
  std::unordered_map<const void*, size_t> sizes;
};
BlockRegistry& Blocks() {
  static auto* r = new BlockRegistry();  // process-long: objects may die during static destruction
  return *r;
}
struct FakeZone {
  char name[32];
};
FakeZone g_default_zone = {"DefaultMallocZone"};

// Apple's malloc rounds blocks up to 16 bytes.
size_t RoundedSize(size_t n) { return (n + 15) & ~size_t{15}; }

// ---- tagged short strings -----------------------------------------------------------------------------------
constexpr uintptr_t kSmallStringTag = 4;
bool IsSmallString(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == kSmallStringTag; }

const char* InternedSmallString(const void* p) {
  static std::mutex mu;
  static auto* interned = new std::set<std::string>();
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  const unsigned len = (v >> 3) & 0xf;
  std::string s;
  for (unsigned i = 0; i < len && i < 8; ++i) s.push_back(static_cast<char>((v >> (64 - 7 * (i + 1))) & 0x7f));
  std::lock_guard<std::mutex> lock(mu);
  return interned->insert(s).first->c_str();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) malloc_zone_t* malloc_zone_from_ptr(const void* ptr) {
  BlockRegistry& r = Blocks();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.sizes.count(ptr) ? reinterpret_cast<malloc_zone_t*>(&g_default_zone) : nullptr;
}

extern "C" __attribute__((visibility("default"))) size_t malloc_size(const void* ptr) {
  BlockRegistry& r = Blocks();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.sizes.find(ptr);
  return it == r.sizes.end() ? 0 : it->second;
}

// Test hook: the block at `ptr` no longer counts as a malloc block (as memory a custom allocator placed would not).
extern "C" __attribute__((visibility("default"))) void tfmo_mock_forget_heap_block(const void* ptr) {
  BlockRegistry& r = Blocks();
  std::lock_guard<std::mutex> lock(r.mu);
  r.sizes.erase(ptr);
}

// ---- NSObject -------------------------------------------------------------------------------------------------
@implementation NSObject
+ (instancetype)alloc {
  return [self allocWithZone:nullptr];
}
+ (instancetype)allocWithZone:(NSZone*)zone {
  id obj = class_createInstance(self, 0);
  BlockRegistry& r = Blocks();
  std::lock_guard<std::mutex> lock(r.mu);
  r.sizes[obj] = RoundedSize(class_getInstanceSize(self));
  return obj;
}
+ (instancetype)new {
  return [[self alloc] init];
}
- (instancetype)init {
  return self;
}
- (void)dealloc {
  {
    BlockRegistry& r = Blocks();
    std::lock_guard<std::mutex> lock(r.mu);
    r.sizes.erase(self);
  }
  object_dispose(self);
}
- (void)_ARCCompliantRetainRelease {
}
- (id)retain {
  return objc_retain(self);
}
- (oneway void)release {
  objc_release(self);
}
- (id)autorelease {
  return objc_autorelease(self);
}
- (id)copy {
  return [(id<NSCopying>)self copyWithZone:nullptr];
}
+ (Class)class {
  return self;
}
+ (Class)superclass {
  return class_getSuperclass(self);
}
+ (BOOL)instancesRespondToSelector:(SEL)aSelector {
  return class_respondsToSelector(self, aSelector);
}
+ (BOOL)conformsToProtocol:(Protocol*)protocol {
  for (Class c = self; c != Nil; c = class_getSuperclass(c))
    if (class_conformsToProtocol(c, protocol)) return YES;
  return NO;
}
- (Class)class {
  return object_getClass(self);
}
- (Class)superclass {
  return class_getSuperclass(object_getClass(self));
}
- (BOOL)isEqual:(id)object {
  return self == object;
}
- (NSUInteger)hash {
  return reinterpret_cast<NSUInteger>(self) >> 4;
}
- (BOOL)isKindOfClass:(Class)aClass {
  for (Class c = object_getClass(self); c != Nil; c = class_getSuperclass(c))
    if (c == aClass) return YES;
  return NO;
}
- (BOOL)isMemberOfClass:(Class)aClass {
  return object_getClass(self) == aClass;
}
- (BOOL)conformsToProtocol:(Protocol*)aProtocol {
  return [object_getClass(self) conformsToProtocol:aProtocol];
}
- (BOOL)respondsToSelector:(SEL)aSelector {
  return class_respondsToSelector(object_getClass(self), aSelector);
}
- (NSString*)description {
  char buf[128];
  snprintf(buf, sizeof buf, "<%s: %p>", object_getClassName(self), (void*)self);
  return [NSString stringWithUTF8String:buf];
}
@end

// ---- NSString ---------------------------------------------------------------------------------------------------
// NSString is abstract (UTF8String and length come from the subclass); instances made at run time are
// TFMOHeapString. The literal classes' layouts are fixed by the compiler.
@interface TFMOHeapString : NSString {
  std::string* _utf8;
}
- (instancetype)initWithBytes:(const char*)bytes length:(size_t)length;
@end

@interface NSConstantString : NSString {
 @public
  uint32_t _flags, _length, _size, _hash;
  const char* _data;
}
@end

@interface TFMOSmallString : NSString
@end

@implementation NSString
+ (instancetype)stringWithUTF8String:(const char*)s {
  return [[[TFMOHeapString alloc] initWithBytes:s length:strlen(s)] autorelease];
}
- (instancetype)initWithUTF8String:(const char*)s {
  [self release];
  return [[TFMOHeapString alloc] initWithBytes:s length:strlen(s)];
}
- (const char*)UTF8String {
  return "";
}
- (NSUInteger)length {
  return strlen(self.UTF8String);
}
- (BOOL)isEqualToString:(NSString*)other {
  return other != nil && strcmp(self.UTF8String, other.UTF8String) == 0;
}
- (BOOL)hasPrefix:(NSString*)str {
  return strncmp(self.UTF8String, str.UTF8String, strlen(str.UTF8String)) == 0;
}
- (BOOL)isEqual:(id)object {
  return [object isKindOfClass:[NSString class]] && [self isEqualToString:object];
}
- (NSUInteger)hash {
  return std::hash<std::string>()(self.UTF8String);
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
- (NSString*)description {
  return self;
}
@end

@implementation TFMOHeapString
- (instancetype)initWithBytes:(const char*)bytes length:(size_t)length {
  _utf8 = new std::string(bytes, length);
  return self;
}
- (void)dealloc {
  delete _utf8;
  [super dealloc];
}
- (const char*)UTF8String {
  return _utf8->c_str();
}
- (NSUInteger)length {
  return _utf8->size();
}
@end

@implementation NSConstantString
- (const char*)UTF8String {
  return _data;
}
- (NSUInteger)length {
  return _length;
}
@end

@implementation TFMOSmallString
+ (void)load {
  objc_registerSmallObjectClass_np(self, kSmallStringTag);
}
- (const char*)UTF8String {
  return InternedSmallString(self);
}
@end

// ---- NSArray --------------------------------------------------------------------------------------------------
@interface NSArray () {
 @protected
  std::vector<id>* _items;  // retained
}
@end

@implementation NSArray
+ (instancetype)array {
  return [[[self alloc] init] autorelease];
}
+ (instancetype)arrayWithObjects:(const id[])objects count:(NSUInteger)cnt {
  NSArray* a = [[self alloc] init];
  for (NSUInteger i = 0; i < cnt; ++i) {
    if (objects[i] == nil) {
      [a release];
      [[NSException exceptionWithName:NSInvalidArgumentException
                               reason:@"-[NSArray arrayWithObjects:count:]: attempt to insert nil object"
                             userInfo:nil] raise];
    }
    a->_items->push_back(objc_retain(objects[i]));
  }
  return [a autorelease];
}
- (instancetype)init {
  _items = new std::vector<id>();
  return self;
}
- (void)dealloc {
  for (id o : *_items) objc_release(o);
  delete _items;
  [super dealloc];
}
- (NSUInteger)count {
  return _items->size();
}
- (id)objectAtIndex:(NSUInteger)index {
  if (index >= _items->size()) {
    char buf[128];
    snprintf(buf, sizeof buf, "-[NSArray objectAtIndex:]: index %lu beyond bounds [0 .. %zu]", index,
             _items->size() - 1);
    [[NSException exceptionWithName:NSInvalidArgumentException
                             reason:[NSString stringWithUTF8String:buf]
                           userInfo:nil] raise];
  }
  return (*_items)[index];
}
- (id)objectAtIndexedSubscript:(NSUInteger)idx {
  return [self objectAtIndex:idx];
}
- (id)firstObject {
  return _items->empty() ? nil : _items->front();
}
- (BOOL)containsObject:(id)anObject {
  for (id o : *_items)
    if ([o isEqual:anObject]) return YES;
  return NO;
}
- (id)copyWithZone:(NSZone*)zone {
  return [NSArray arrayWithObjects:_items->data() count:_items->size()].retain;
}
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState*)state
                                  objects:(id __unsafe_unretained[])buffer
                                    count:(NSUInteger)len {
  if (state->state != 0) return 0;  // everything is handed out at once
  state->state = 1;
  state->itemsPtr = _items->data();
  state->mutationsPtr = &state->extra[0];  // immutable while enumerated (NSMutableArray counts mutations below)
  return _items->size();
}
@end

@implementation NSMutableArray
- (void)addObject:(id)anObject {
  if (anObject == nil)
    [[NSException exceptionWithName:NSInvalidArgumentException
                             reason:@"-[NSMutableArray addObject:]: object cannot be nil"
                           userInfo:nil] raise];
  _items->push_back(objc_retain(anObject));
}
- (void)removeAllObjects {
  for (id o : *_items) objc_release(o);
  _items->clear();
}
@end

// ---- NSDictionary ---------------------------------------------------------------------------------------------
@interface NSDictionary () {
  std::vector<std::pair<id, id>>* _entries;  // both retained; keys are copies
}
@end

@implementation NSDictionary
+ (instancetype)dictionaryWithObjects:(const id[])objects forKeys:(const id<NSCopying>[])keys count:(NSUInteger)cnt {
  NSDictionary* d = [[self alloc] init];
  for (NSUInteger i = 0; i < cnt; ++i) {
    if (objects[i] == nil || keys[i] == nil) {
      [d release];
      [[NSException exceptionWithName:NSInvalidArgumentException
                               reason:@"-[NSDictionary dictionaryWithObjects:forKeys:count:]: attempt to insert nil"
                             userInfo:nil] raise];
    }
    d->_entries->emplace_back([(id)keys[i] copy], objc_retain(objects[i]));
  }
  return [d autorelease];
}
- (instancetype)init {
  _entries = new std::vector<std::pair<id, id>>();
  return self;
}
- (void)dealloc {
  for (auto& e : *_entries) {
    objc_release(e.first);
    objc_release(e.second);
  }
  delete _entries;
  [super dealloc];
}
- (NSUInteger)count {
  return _entries->size();
}
- (id)objectForKey:(id)aKey {
  for (auto& e : *_entries)
    if ([e.first isEqual:aKey]) return e.second;
  return nil;
}
- (id)objectForKeyedSubscript:(id)key {
  return [self objectForKey:key];
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
@end

// ---- NSError --------------------------------------------------------------------------------------------------
NSErrorUserInfoKey const NSLocalizedDescriptionKey = @"NSLocalizedDescription";

@interface NSError () {
  NSString* _domain;
  NSInteger _code;
  NSDictionary* _userInfo;
}
@end

@implementation NSError
+ (instancetype)errorWithDomain:(NSErrorDomain)domain code:(NSInteger)code userInfo:(NSDictionary*)dict {
  NSError* e = [[self alloc] init];
  e->_domain = [domain copy];
  e->_code = code;
  e->_userInfo = dict ? [dict copy] : [[NSDictionary alloc] init];
  return [e autorelease];
}
- (void)dealloc {
  [_domain release];
  [_userInfo release];
  [super dealloc];
}
- (NSErrorDomain)domain {
  return _domain;
}
- (NSInteger)code {
  return _code;
}
- (NSDictionary*)userInfo {
  return _userInfo;
}
- (NSString*)localizedDescription {
  id text = [_userInfo objectForKey:NSLocalizedDescriptionKey];
  if ([text isKindOfClass:[NSString class]]) return text;
  char buf[512];  // Apple's fallback wording
  snprintf(buf, sizeof buf, "The operation couldn\u2019t be completed. (%s error %ld.)", _domain.UTF8String,
           static_cast<long>(_code));
  return [NSString stringWithUTF8String:buf];
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
- (NSString*)description {
  return self.localizedDescription;
}
@end

// ---- NSException ----------------------------------------------------------------------------------------------
NSExceptionName const NSInvalidArgumentException = @"NSInvalidArgumentException";
NSExceptionName const NSInternalInconsistencyException = @"NSInternalInconsistencyException";

@interface NSException () {
  NSString* _name;
  NSString* _reason;
  NSDictionary* _userInfo;
}
@end

@implementation NSException
+ (NSException*)exceptionWithName:(NSExceptionName)name reason:(NSString*)reason userInfo:(NSDictionary*)userInfo {
  NSException* e = [[self alloc] init];
  e->_name = [name copy];
  e->_reason = [reason copy];
  e->_userInfo = [userInfo copy];
  return [e autorelease];
}
- (void)dealloc {
  [_name release];
  [_reason release];
  [_userInfo release];
  [super dealloc];
}
- (NSExceptionName)name {
  return _name;
}
- (NSString*)reason {
  return _reason;
}
- (NSDictionary*)userInfo {
  return _userInfo;
}
- (void)raise {
  @throw self;
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
@end

// ---- NSURL (file URLs only) -----------------------------------------------------------------------------------
@interface NSURL () {
  NSString* _path;
}
+ (NSURL*)tfmo_fileURLWithPathString:(const std::string&)path;
@end

@implementation NSURL
+ (NSURL*)tfmo_fileURLWithPathString:(const std::string&)path {
  NSURL* u = [[self alloc] init];
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  u->_path = [[NSString alloc] initWithUTF8String:p.c_str()];
  return [u autorelease];
}
+ (NSURL*)fileURLWithPath:(NSString*)path {
  std::string p = path.UTF8String;
  if (p.empty() || p[0] != '/') {  // relative to the working directory, as Apple's
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) != nullptr) p = std::string(cwd) + "/" + p;
  }
  return [self tfmo_fileURLWithPathString:p];
}
- (void)dealloc {
  [_path release];
  [super dealloc];
}
- (NSString*)path {
  return _path;
}
- (BOOL)isFileURL {
  return YES;
}
- (NSURL*)URLByAppendingPathComponent:(NSString*)pathComponent {
  std::string p = _path.UTF8String;
  return [NSURL tfmo_fileURLWithPathString:(p == "/" ? p : p + "/") + pathComponent.UTF8String];
}
- (NSURL*)URLByDeletingLastPathComponent {
  std::string p = _path.UTF8String;
  const size_t slash = p.rfind('/');
  return [NSURL tfmo_fileURLWithPathString:slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash)];
}
- (NSURL*)URLByResolvingSymlinksInPath {
  char resolved[PATH_MAX];
  if (realpath(_path.UTF8String, resolved) == nullptr) return self;  // Apple's: unchanged if it does not exist
  return [NSURL tfmo_fileURLWithPathString:resolved];
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
- (NSString*)description {
  return [NSString stringWithUTF8String:(std::string("file://") + _path.UTF8String).c_str()];
}
@end

// ---- NSFileManager, NSDate, NSProcessInfo ---------------------------------------------------------------------
@implementation NSFileManager
+ (NSFileManager*)defaultManager {
  static NSFileManager* m = [[NSFileManager alloc] init];
  return m;
}
- (BOOL)fileExistsAtPath:(NSString*)path {
  struct stat st;
  return path != nil && stat(path.UTF8String, &st) == 0;
}
- (NSString*)stringWithFileSystemRepresentation:(const char*)str length:(NSUInteger)len {
  return [[[TFMOHeapString alloc] initWithBytes:str length:len] autorelease];
}
@end

@interface NSDate () {
  double _seconds;  // CLOCK_REALTIME
}
@end

namespace {
double Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
}  // namespace

@implementation NSDate
+ (instancetype)date {
  NSDate* d = [[self alloc] init];
  d->_seconds = Now();
  return [d autorelease];
}
- (NSTimeInterval)timeIntervalSinceNow {
  return _seconds - Now();
}
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
@end

@implementation NSProcessInfo
+ (NSProcessInfo*)processInfo {
  static NSProcessInfo* p = [[NSProcessInfo alloc] init];
  return p;
}
- (NSString*)operatingSystemVersionString {
  utsname u;
  std::string s = "Linux (tf-metal-ops Foundation double)";
  if (uname(&u) == 0) s = std::string(u.sysname) + " " + u.release + " (tf-metal-ops Foundation double)";
  return [NSString stringWithUTF8String:s.c_str()];
}
@end
